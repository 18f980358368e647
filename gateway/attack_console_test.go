package gateway_test

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/console"
)

const consoleKey = "mf-console-admin-key-0123456789"

// consoleGateway is a gateway with one admin key, its console on, and proxies at
// trusted believed about X-Forwarded-Proto.
func consoleGateway(t *testing.T, trusted ...string) runningGateway {
	t.Helper()
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(consoleKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return startGateway(t, cluster(t), gateway.Config{APIKeysFile: keys, TrustedProxies: trusted, GatewayID: "gw-console"})
}

// signIn posts key to the console's sign-in form through c with hdr, and is the
// answer's status and session cookie (nil when none).
func signIn(t *testing.T, c *http.Client, g runningGateway, key string, hdr map[string]string) (int, *http.Cookie) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.url+console.Prefix+"/login",
		strings.NewReader(url.Values{"key": {key}, "next": {console.Prefix + "/models"}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := noFollow(c).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for _, ck := range resp.Cookies() {
		if ck.Name == console.CookieName {
			return resp.StatusCode, ck
		}
	}
	return resp.StatusCode, nil
}

// consoleGet GETs a console page (or POSTs to path) with cookie, not following
// redirects: 200 is a page shown, 303 a redirect to the sign-in form.
func consoleDo(t *testing.T, c *http.Client, method, u string, cookie *http.Cookie) int {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(cookie)
	resp, err := noFollow(c).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func noFollow(c *http.Client) *http.Client {
	cc := *c
	cc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cc
}

// TestAttackConsoleCookieIsTheKey: an admin signs in to the gateway's console behind a
// TLS ingress (X-Forwarded-Proto: https from the trusted proxy at 127.0.0.1). Before,
// the cookie was the API key itself, so anything that reads cookies (a browser
// profile, a proxy's log) had the admin key, and it was not Secure behind the
// ingress, so a browser would send it over plain HTTP. Now it is an opaque session id
// holding no part of the key, Secure, HttpOnly and SameSite=Strict; and a client not
// at a trusted proxy cannot make the gateway believe its X-Forwarded-Proto.
func TestAttackConsoleCookieIsTheKey(t *testing.T) {
	g := consoleGateway(t, "127.0.0.1/32")
	code, ck := signIn(t, from("127.0.0.1"), g, consoleKey, map[string]string{"X-Forwarded-Proto": "https"})
	if code != http.StatusSeeOther || ck == nil {
		t.Fatalf("signing in: %d, cookie %v", code, ck)
	}
	for _, part := range []string{consoleKey, consoleKey[:12], consoleKey[len(consoleKey)-12:]} {
		if strings.Contains(ck.Value, part) {
			t.Errorf("the session cookie %q holds the API key (%q)", ck.Value, part)
		}
	}
	if !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Errorf("the session cookie behind a TLS ingress: Secure %v, HttpOnly %v, SameSite %v; want Secure, HttpOnly, Strict",
			ck.Secure, ck.HttpOnly, ck.SameSite)
	}
	if code := consoleDo(t, from("127.0.0.1"), http.MethodGet, g.url+console.Prefix+"/models", ck); code != http.StatusOK {
		t.Errorf("the models page with the session cookie: %d, want 200", code)
	}
	if _, ck := signIn(t, from("127.0.0.2"), g, consoleKey, map[string]string{"X-Forwarded-Proto": "https"}); ck == nil || ck.Secure {
		t.Errorf("a client at 127.0.0.2 (not a trusted proxy) saying X-Forwarded-Proto: https: cookie %v, want one not Secure", ck)
	}
}

// TestAttackConsoleLoginGuessing: one address tries 100 wrong keys on the console's
// sign-in form. Before, each got a 401 at once, as fast as it could ask. Now the
// address is answered 429 with Retry-After past a burst of console.LoginBurst, and an
// admin at another address still signs in.
func TestAttackConsoleLoginGuessing(t *testing.T) {
	const tries = 100
	g := consoleGateway(t)
	attacker := from("127.0.0.1")
	codes := map[int]int{}
	start := time.Now()
	for i := range tries {
		code, ck := signIn(t, attacker, g, "mf-guess-"+strings.Repeat("x", i%7)+string(rune('a'+i%26)), nil)
		codes[code]++
		if ck != nil {
			t.Fatalf("a wrong key got a session cookie")
		}
		if code != http.StatusUnauthorized && code != http.StatusTooManyRequests {
			t.Fatalf("wrong sign-in %d from one address: %d, want 401 or 429", i+1, code)
		}
	}
	// The bucket refills one sign-in every LoginEvery while the attack runs.
	bound := console.LoginBurst + int(time.Since(start)/console.LoginEvery) + 1
	t.Logf("%d wrong sign-ins from one address in %v: %v (bound %d checked)", tries, time.Since(start).Round(time.Millisecond), codes, bound)
	if codes[http.StatusUnauthorized] > bound || codes[http.StatusTooManyRequests] < tries-bound {
		t.Errorf("%d of %d wrong keys were checked, want at most %d, the others 429", codes[http.StatusUnauthorized], tries, bound)
	}
	if code, ck := signIn(t, from("127.0.0.2"), g, consoleKey, nil); code != http.StatusSeeOther || ck == nil {
		t.Errorf("the admin at another address during the guessing: %d, cookie %v; want 303 and a session", code, ck)
	}
}

// TestAttackStolenConsoleCookieAfterLogout: a session cookie copied off the admin's
// machine is replayed after the admin signed out. Before, the cookie was the key, so
// sign-out changed nothing for whoever held a copy. Now sign-out ends the session at
// the gateway: the copy gets the sign-in form, and the playground's chat a 401.
func TestAttackStolenConsoleCookieAfterLogout(t *testing.T) {
	g := consoleGateway(t)
	admin := from("127.0.0.1")
	_, ck := signIn(t, admin, g, consoleKey, nil)
	if ck == nil {
		t.Fatal("no session cookie after signing in")
	}
	stolen := *ck
	if code := consoleDo(t, from("127.0.0.2"), http.MethodGet, g.url+console.Prefix+"/models", &stolen); code != http.StatusOK {
		t.Fatalf("the copied cookie before sign-out: %d, want 200 (it is a live session)", code)
	}
	if code := consoleDo(t, admin, http.MethodPost, g.url+console.Prefix+"/logout", ck); code != http.StatusSeeOther {
		t.Fatalf("signing out: %d", code)
	}
	if code := consoleDo(t, from("127.0.0.2"), http.MethodGet, g.url+console.Prefix+"/models", &stolen); code != http.StatusSeeOther {
		t.Errorf("the copied cookie after sign-out: %d, want 303 to the sign-in form", code)
	}
	req, err := http.NewRequest(http.MethodPost, g.url+console.Prefix+"/chat",
		strings.NewReader(`{"model":"x","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(console.ConsoleHeader, "1")
	req.AddCookie(&stolen)
	resp, err := from("127.0.0.2").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the playground's chat with the copied cookie after sign-out: %d, want 401", resp.StatusCode)
	}
}

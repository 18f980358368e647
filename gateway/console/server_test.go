package console

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

const testKey, teamKey = "key-1", "team-a-key"

// seen is what the fake API received from the playground.
type seen struct{ path, auth, cookie, console, body string }

// keys identifies testKey as an admin key and teamKey as team-a's.
func keys(k string) (tenancy.Identity, bool) {
	switch k {
	case testKey:
		return tenancy.Identity{Admin: true}, true
	case teamKey:
		return tenancy.Identity{Namespace: "team-a", Name: "ci"}, true
	}
	return tenancy.Identity{}, false
}

func serve(t *testing.T, identify func(string) (tenancy.Identity, bool), source func(context.Context) (Snapshot, error)) (*httptest.Server, chan seen) {
	t.Helper()
	got := make(chan seen, 1)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("Cookie"), r.Header.Get(ConsoleHeader), string(b)}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	})
	usage := func(ctx context.Context) ([]mfv1.TokenUsage, error) {
		s, err := source(ctx)
		return s.Usage, err
	}
	h, err := New(Options{Source: source, Usage: usage, API: api, Identify: identify, Now: func() time.Time { return now }, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, got
}

func fixed(s Snapshot) func(context.Context) (Snapshot, error) {
	return func(context.Context) (Snapshot, error) { return s, nil }
}

// noRedirect is a client that shows redirects instead of following them.
func noRedirect(jar http.CookieJar) *http.Client {
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func do(t *testing.T, c *http.Client, method, u string, body io.Reader, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func hostile() Snapshot {
	n := mac("mac-1", metav1.ConditionTrue, time.Minute, mfv1.NodeMemoryStatus{Ceiling: q("8Gi"), Used: q("3Gi")})
	n.Status.Hardware.Chip = `<script>alert("chip")</script>`
	return Snapshot{Nodes: []mfv1.MacNode{n}}
}

func TestPagesRequireAKey(t *testing.T) {
	srv, _ := serve(t, keys, fixed(hostile()))
	c := noRedirect(nil)
	for _, p := range []string{"/ui/", "/ui/models", "/ui/unloads", "/ui/playground"} {
		resp, _ := do(t, c, "GET", srv.URL+p, nil, nil)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/login?next="+url.QueryEscape(p) {
			t.Errorf("GET %s without a key: %d %q", p, resp.StatusCode, resp.Header.Get("Location"))
		}
		resp, _ = do(t, c, "GET", srv.URL+p, nil, map[string]string{"Authorization": "Bearer wrong"})
		if resp.StatusCode != http.StatusSeeOther {
			t.Errorf("GET %s with a wrong key: %d", p, resp.StatusCode)
		}
		resp, body := do(t, c, "GET", srv.URL+p, nil, map[string]string{"Authorization": "Bearer " + testKey})
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "<h1>") {
			t.Errorf("GET %s with the key: %d %s", p, resp.StatusCode, body)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); csp != ContentSecurityPolicy {
			t.Errorf("GET %s: CSP %q", p, csp)
		}
	}
	resp, body := do(t, c, "GET", srv.URL+"/ui/static/console.js", nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "replaceChildren") {
		t.Errorf("the script is public: %d", resp.StatusCode)
	}
	if resp, _ := do(t, c, "GET", srv.URL+"/ui/nope", nil, map[string]string{"Authorization": "Bearer " + testKey}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown page: %d", resp.StatusCode)
	}
}

func TestPagesEscapeWhatTheyShow(t *testing.T) {
	srv, _ := serve(t, nil, fixed(hostile()))
	_, body := do(t, http.DefaultClient, "GET", srv.URL+"/ui/", nil, nil)
	if strings.Contains(body, `<script>alert`) || !strings.Contains(body, `&lt;script&gt;alert(&#34;chip&#34;)&lt;/script&gt;`) {
		t.Errorf("the chip is not escaped:\n%s", body)
	}
	for _, want := range []string{`data-node="mac-1"`, `data-bytes="3221225472"`, `3.0 GiB used of 8.0 GiB ceiling`, `role="img"`} {
		if !strings.Contains(body, want) {
			t.Errorf("fleet page lacks %q", want)
		}
	}
}

// The fleet page, as served, shows a Mac's effective ceiling and its report beside it.
func TestFleetPageShowsTheEffectiveCeiling(t *testing.T) {
	n := mac("mac-liar", metav1.ConditionTrue, time.Minute, mfv1.NodeMemoryStatus{Ceiling: q("1Ti"), Used: q("3Gi")})
	n.Status.Hardware.Chip = "Apple M4"
	srv, _ := serve(t, nil, fixed(Snapshot{Nodes: []mfv1.MacNode{n}}))
	_, body := do(t, http.DefaultClient, "GET", srv.URL+"/ui/", nil, nil)
	for _, want := range []string{`class="ceiling">32.0 GiB <small class="reported" data-bytes="1099511627776">reported 1.0 TiB, capped</small>`,
		`3.0 GiB used of 32.0 GiB</span>`, `3.0 GiB used of 32.0 GiB ceiling (the Mac reports 1.0 TiB, capped by the chip&#39;s memory)`} {
		if !strings.Contains(body, want) {
			t.Errorf("fleet page lacks %q", want)
		}
	}
}

func TestSignInSetsACookieTheChatUses(t *testing.T) {
	srv, got := serve(t, keys, fixed(hostile()))
	jar, _ := cookiejar.New(nil)
	c := noRedirect(jar)
	form := func(key string) io.Reader {
		return strings.NewReader(url.Values{"key": {key}, "next": {"/ui/models"}}.Encode())
	}
	formHdr := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}

	resp, body := do(t, c, "POST", srv.URL+"/ui/login", form("wrong"), formHdr)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "not an API key of this gateway") || len(resp.Cookies()) != 0 {
		t.Fatalf("a wrong key: %d %v", resp.StatusCode, resp.Cookies())
	}
	resp, _ = do(t, c, "POST", srv.URL+"/ui/login", form(testKey), formHdr)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/models" {
		t.Fatalf("sign-in: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	ck := resp.Cookies()
	if len(ck) != 1 || !ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode || ck[0].Path != "/ui" {
		t.Fatalf("cookie %+v", ck)
	}
	if resp, _ := do(t, c, "GET", srv.URL+"/ui/", nil, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("with the cookie: %d", resp.StatusCode)
	}

	chat := `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	if resp, _ := do(t, c, "POST", srv.URL+"/ui/chat", strings.NewReader(chat), nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("chat without the console header: %d", resp.StatusCode)
	}
	if resp, _ := do(t, c, "POST", srv.URL+"/ui/chat", strings.NewReader(chat),
		map[string]string{ConsoleHeader: "1", "Sec-Fetch-Site": "cross-site"}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a cross-site chat: %d", resp.StatusCode)
	}
	resp, body = do(t, c, "POST", srv.URL+"/ui/chat", strings.NewReader(chat), map[string]string{ConsoleHeader: "1"})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"content":"hi"`) {
		t.Fatalf("chat: %d %s", resp.StatusCode, body)
	}
	want := seen{path: "/v1/chat/completions", auth: "Bearer " + testKey, body: chat}
	if s := <-got; s != want {
		t.Errorf("the API got %+v, want %+v", s, want)
	}

	resp, _ = do(t, c, "POST", srv.URL+"/ui/logout", nil, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Errorf("sign-out: %d", resp.StatusCode)
	}
	if resp, _ := do(t, c, "GET", srv.URL+"/ui/", nil, nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("after sign-out: %d", resp.StatusCode)
	}
	if resp, _ := do(t, c, "POST", srv.URL+"/ui/chat", strings.NewReader(chat), map[string]string{ConsoleHeader: "1"}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("chat after sign-out: %d", resp.StatusCode)
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{"/ui/models": "/ui/models", "": "/ui/", "https://evil.example/": "/ui/",
		"//evil.example/ui/": "/ui/", "/ui/\\evil": "/ui/", "/other": "/ui/"} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnreadableFleet(t *testing.T) {
	srv, _ := serve(t, nil, func(context.Context) (Snapshot, error) { return Snapshot{}, errors.New("cache not synced") })
	resp, body := do(t, http.DefaultClient, "GET", srv.URL+"/ui/", nil, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(body, "cache not synced") {
		t.Errorf("%d %s", resp.StatusCode, body)
	}
}

// TestTeamKeyInTheConsole: a team's key signs in, lands on the models page instead of
// the fleet page, gets 403 on the fleet page and on another namespace's usage, and
// never a byte of team B's on the pages it may open; an admin key sees both teams.
func TestTeamKeyInTheConsole(t *testing.T) {
	srv, _ := serve(t, keys, fixed(twoTeams()))
	jar, _ := cookiejar.New(nil)
	c := noRedirect(jar)
	resp, _ := do(t, c, "POST", srv.URL+"/ui/login", strings.NewReader(url.Values{"key": {teamKey}, "next": {"/ui/"}}.Encode()),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/models" {
		t.Fatalf("a team's sign-in: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, p := range []string{"/ui/", "/ui/usage?namespace=team-b"} {
		resp, body := do(t, c, "GET", srv.URL+p, nil, nil)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "admin key") || strings.Contains(body, "data-live") {
			t.Errorf("GET %s with a team's key: %d\n%s", p, resp.StatusCode, body)
		}
	}
	for _, p := range []string{"/ui/models", "/ui/unloads", "/ui/playground", "/ui/usage", "/ui/usage?namespace=team-a&days=30"} {
		resp, body := do(t, c, "GET", srv.URL+p, nil, nil)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s with a team's key: %d", p, resp.StatusCode)
		}
		for _, f := range []string{bSource, bDigest, bPrivate, bReplica, bKey, macA, "987654", `href="/ui/"`} {
			if strings.Contains(body, f) {
				t.Errorf("GET %s with team-a's key shows %q", p, f)
			}
		}
	}
	if _, body := do(t, c, "GET", srv.URL+"/ui/models", nil, nil); !strings.Contains(body, "shared with your namespace by team-b") {
		t.Errorf("the granted deployment is not shown as shared:\n%s", body)
	}
	// An admin key sees both teams, Macs included.
	c = noRedirect(nil)
	hdr := map[string]string{"Authorization": "Bearer " + testKey}
	for p, want := range map[string][]string{"/ui/": {macA, macB}, "/ui/models": {bPrivate, bDigest, bReplica},
		"/ui/usage?namespace=team-b": {bKey, "987654"}, "/ui/usage": {bKey, "ci"}} {
		resp, body := do(t, c, "GET", srv.URL+p, nil, hdr)
		for _, w := range want {
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, w) {
				t.Errorf("GET %s with an admin key: %d, lacks %q", p, resp.StatusCode, w)
			}
		}
	}
}

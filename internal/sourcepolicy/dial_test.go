package sourcepolicy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

func TestTransportChecksTheDialledAddress(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	// "localhost" is a name: only the address it resolves to tells it is loopback.
	byName := "http://localhost:" + port + "/m.gguf"

	h := NewHolder(nil) // the default denies loopback
	cli := h.Client(nil)
	for _, u := range []string{srv.URL + "/m.gguf", byName} {
		resp, err := cli.Get(u)
		if err == nil {
			_ = resp.Body.Close()
			t.Fatalf("GET %s through the default policy succeeded, want a denial", u)
		}
		var de *DeniedError
		if !errors.As(err, &de) {
			t.Fatalf("GET %s: %v, want a *DeniedError", u, err)
		}
		if !strings.Contains(de.Error(), "is loopback, which model fetches may not connect to") || !strings.Contains(de.Error(), "spec.allowedNetworks") {
			t.Errorf("denial %q does not say why and how to allow it", de.Error())
		}
	}

	// Allowing loopback explicitly lets the same requests through, on a policy
	// swapped in while the client exists.
	p, err := Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: v1alpha1.SourcePolicySpec{AllowedNetworks: []string{"127.0.0.0/8", "::1/128"}}})
	if err != nil {
		t.Fatal(err)
	}
	h.Set(p)
	for _, u := range []string{srv.URL + "/m.gguf", byName} {
		resp, err := cli.Get(u)
		if err != nil {
			t.Fatalf("GET %s with loopback allowed: %v", u, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", u, resp.Status)
		}
	}
}

func TestClientKeepsItsSettings(t *testing.T) {
	for _, k := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"} {
		t.Setenv(k, "") // a proxy in the environment would be used (proxy.go)
	}
	h := NewHolder(nil)
	base := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	c := h.Client(base)
	if c == base || c.CheckRedirect == nil {
		t.Fatalf("Client did not copy the client's settings")
	}
	if tr, ok := c.Transport.(*http.Transport); !ok || tr.DialContext == nil || tr.Proxy != nil {
		t.Fatalf("Client's transport is %T without the guarded dialer, or with a proxy", c.Transport)
	}
	if base.Transport != nil {
		t.Fatalf("Client changed the client it was given")
	}
}

// A redirect of an http(s) source must lead to a host the namespace may use; without
// ForSource (a registry's CDN) only the address is checked.
func TestClientChecksRedirectTargets(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("model")) }))
	t.Cleanup(target.Close)
	_, port, _ := net.SplitHostPort(target.Listener.Addr().String())
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// To the same server under another name: only the host differs.
		http.Redirect(w, r, "http://localhost:"+port+"/m.gguf", http.StatusFound)
	}))
	t.Cleanup(origin.Close)
	p, err := Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: v1alpha1.SourcePolicySpec{
			Rules:           []v1alpha1.SourcePolicyRule{{Namespaces: []string{"team-a"}, Hosts: []string{"127.0.0.1"}, AllowPlainHTTP: true}},
			AllowedNetworks: []string{"127.0.0.0/8", "::1/128"},
		}})
	if err != nil {
		t.Fatal(err)
	}
	h := NewHolder(p)
	cli := h.Client(nil)
	get := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, origin.URL+"/m.gguf", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}
	err = get(ForSource(t.Context(), "team-a", origin.URL+"/m.gguf"))
	var de *DeniedError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), `redirects to http://localhost:`+port+`/m.gguf: source host "localhost" is not allowed for namespace "team-a"`) {
		t.Fatalf("redirect to an unlisted host: %v, want a denial naming it", err)
	}
	if err := get(t.Context()); err != nil {
		t.Fatalf("the same redirect without ForSource (a registry): %v", err)
	}
}

func TestDecideRedirect(t *testing.T) {
	for _, tc := range []struct {
		from, to string
		allow    bool
	}{
		{"https://models.example.com/m.gguf", "https://cdn.example.net/x?sig=secret", true},
		{"http://models.example.com/m.gguf", "http://cdn.example.net/x", true},
		{"http://models.example.com/m.gguf", "https://cdn.example.net/x", true},
		{"https://models.example.com/m.gguf", "http://cdn.example.net/x?sig=secret", false},
		{"HTTPS://models.example.com/m.gguf", "HTTP://models.example.com/m.gguf", false},
	} {
		from, _ := url.Parse(tc.from)
		to, _ := url.Parse(tc.to)
		d := DecideRedirect(from, to)
		if d.Allowed != tc.allow {
			t.Errorf("DecideRedirect(%s, %s) = %+v, want allowed=%v", tc.from, tc.to, d, tc.allow)
		}
		if !tc.allow && (!strings.Contains(d.Reason, "from https:// to plain http://") || strings.Contains(d.Reason, "secret")) {
			t.Errorf("reason %q: want the downgrade named, without the query", d.Reason)
		}
	}
}

// A registry's redirect (no ForSource context) may not downgrade either.
func TestClientRefusesADowngradeWithoutASource(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("model")) }))
	t.Cleanup(plain.Close)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/m.gguf", http.StatusFound)
	}))
	t.Cleanup(tlsSrv.Close)
	p, err := Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: v1alpha1.SourcePolicySpec{AllowedNetworks: []string{"127.0.0.0/8"}}})
	if err != nil {
		t.Fatal(err)
	}
	cli := NewHolder(p).Client(tlsSrv.Client())
	resp, err := cli.Get(tlsSrv.URL + "/m.gguf")
	if err == nil {
		_ = resp.Body.Close()
	}
	if !IsDenied(err) || !strings.Contains(err.Error(), "from https:// to plain http://") {
		t.Fatalf("an https to http redirect: %v, want a denial", err)
	}
}

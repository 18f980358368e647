package store

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// Locate resolves a source under the policy without downloading it: the hub token
// goes with an hf:// source only, an ollama:// source's manifest names the blob, the
// namespace's rules and the address rules refuse as they do for Fetch, and the
// client it hands out checks an http(s):// source's redirects against the
// namespace's hosts.
func TestLocate(t *testing.T) {
	const digest = "sha256:" + "ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12"
	var (
		port string
		mu   sync.Mutex
		seen []string
	)
	requests := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path)
		mu.Unlock()
		switch r.URL.Path {
		case "/v2/library/coder/manifests/7b":
			_, _ = w.Write([]byte(`{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"` + digest + `","size":4096}]}`))
		case "/m.gguf":
			http.Redirect(w, r, "http://localhost:"+port+"/elsewhere.gguf", http.StatusFound)
		default:
			_, _ = w.Write([]byte("GGUF"))
		}
	}))
	t.Cleanup(srv.Close)
	_, port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	l := NewLocator(Options{HFEndpoint: srv.URL, OllamaRegistry: srv.URL, HFToken: "hf_secret", Policy: testPolicy(t)})

	r, err := l.Locate(t.Context(), testNS, "hf://org/repo/m.gguf@v2")
	if err != nil {
		t.Fatal(err)
	}
	if want := srv.URL + "/org/repo/resolve/v2/m.gguf"; r.Location.URL != want || r.Header.Get("Authorization") != "Bearer hf_secret" {
		t.Errorf("hf:// located at %q with %v; want %q with the token", r.Location.URL, r.Header, want)
	}

	r, err = l.Locate(t.Context(), testNS, "ollama://coder:7b")
	if err != nil {
		t.Fatal(err)
	}
	if want := srv.URL + "/v2/library/coder/blobs/" + digest; r.Location.URL != want || r.Location.Size != 4096 || r.Header != nil {
		t.Errorf("ollama:// located at %q (size %d, header %v); want %q, 4096 bytes and no token", r.Location.URL, r.Location.Size, r.Header, want)
	}

	// The namespace's rules: another namespace may use nothing.
	_, err = l.Locate(t.Context(), "team-other", "hf://org/repo/m.gguf")
	wantDenied(t, err, `namespace "team-other"`)
	// The address rules: the default policy refuses loopback when a connection is made.
	deflt := NewLocator(Options{OllamaRegistry: srv.URL})
	_, err = deflt.Locate(t.Context(), testNS, "ollama://coder:7b")
	wantDenied(t, err, "loopback")

	// An http(s):// source's redirect to a host the namespace may not use is refused.
	strict := NewLocator(Options{Policy: policyHolder(t, v1alpha1.SourcePolicySpec{
		Rules:           []v1alpha1.SourcePolicyRule{{Namespaces: []string{testNS}, Hosts: []string{"127.0.0.1"}, AllowPlainHTTP: true}},
		AllowedNetworks: []string{"127.0.0.0/8", "::1/128"}})})
	r, err = strict.Locate(t.Context(), testNS, srv.URL+"/m.gguf")
	if err != nil {
		t.Fatal(err)
	}
	before := len(requests())
	resp, err := r.Client.Get(r.Location.URL)
	if err == nil {
		resp.Body.Close()
	}
	wantDenied(t, err, "redirects to http://localhost:"+port+`/elsewhere.gguf: source host "localhost" is not allowed for namespace "team-test"`)
	if got := requests()[before:]; len(got) != 1 {
		t.Errorf("the server saw %q after the redirect; want only the first request", got)
	}

	if _, err := l.Locate(t.Context(), testNS, "file:///models/m.gguf"); err == nil {
		t.Error("a file:// source was located; want it refused (it is read in place)")
	}
}

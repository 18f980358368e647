package store

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/test/support/fwdproxy"
	"github.com/macfleet/macfleet/test/support/hubdouble"
)

// TestFetchThroughEnvironmentProxy: a Mac whose only way out is an HTTP proxy
// downloads through HTTP_PROXY/HTTPS_PROXY. The hub's name resolves only at the
// proxy, so the download can succeed no other way.
func TestFetchThroughEnvironmentProxy(t *testing.T) {
	content := bytes.Repeat([]byte("GGUF weights "), 4096)
	hub := hubdouble.New(hubdouble.Content("/org/repo/resolve/main/m.gguf", bytes.NewReader(content), int64(len(content))))
	t.Cleanup(hub.Close)
	const hubHost = "hub.example.test"
	proxy := fwdproxy.New(map[string]string{hubHost + ":80": hub.Listener.Addr().String()})
	t.Cleanup(proxy.Close)

	fetch := func() (string, error) {
		s, err := New(t.TempDir(), Options{Log: logr.Discard(), Policy: testPolicy(t), HFEndpoint: "http://" + hubHost})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return s.Fetch(ctx, testNS, "hf://org/repo/m.gguf", "", nil)
	}

	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"} {
		t.Setenv(k, "")
	}
	if _, err := fetch(); err == nil {
		t.Fatalf("fetching from %s without a proxy succeeded: the test's host name must resolve only at the proxy", hubHost)
	}

	t.Setenv("HTTP_PROXY", proxy.URL)
	t.Setenv("HTTPS_PROXY", proxy.URL)
	path, err := fetch()
	if err != nil {
		t.Fatalf("fetching through HTTP_PROXY=%s: %v", proxy.URL, err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, content) {
		t.Errorf("the file fetched through the proxy has %d bytes, want the hub's %d", len(got), len(content))
	}
	if targets := proxy.Targets(); !slices.ContainsFunc(targets, func(s string) bool { return strings.HasSuffix(s, hubHost+":80") }) {
		t.Errorf("the proxy saw %q, want requests for %s", targets, hubHost)
	}

	t.Setenv("NO_PROXY", hubHost)
	before := len(proxy.Targets())
	if _, err := fetch(); err == nil {
		t.Errorf("NO_PROXY=%s: the fetch reached the hub anyway", hubHost)
	}
	if n := len(proxy.Targets()); n != before {
		t.Errorf("NO_PROXY=%s: the proxy was still asked (%d requests, %d before)", hubHost, n, before)
	}
}

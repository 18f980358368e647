package sourcepolicy

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/macfleet/macfleet/test/support/fwdproxy"
)

// TestProxiedFetchChecksTargets: with HTTP_PROXY set, a source naming a
// denied address (the cloud's metadata service, loopback) would have the proxy
// connect there for us, past the dialer's check. The target is checked before the
// proxy is asked; a name the client cannot resolve is the proxy's to resolve.
func TestProxiedFetchChecksTargets(t *testing.T) {
	proxy := fwdproxy.New(map[string]string{})
	t.Cleanup(proxy.Close)
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		t.Setenv(k, proxy.URL)
	}
	t.Setenv("NO_PROXY", "")
	t.Setenv("no_proxy", "")
	client := NewHolder(nil).Client(nil) // the default policy: no metadata, no private networks
	for _, tt := range []struct {
		url        string
		wantDenied bool
	}{
		{"http://169.254.169.254/latest/meta-data/", true},
		{"http://10.1.2.3/model.gguf", true},
		{"http://[fd00::1]/model.gguf", true},
		// Unresolvable here: the proxy is asked (and answers 502, knowing no such host).
		{"http://models.example.test/model.gguf", false},
	} {
		t.Run(tt.url, func(t *testing.T) {
			before := len(proxy.Targets())
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, tt.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if resp != nil {
				resp.Body.Close()
			}
			asked := len(proxy.Targets()) > before
			if tt.wantDenied {
				if !IsDenied(err) || asked {
					t.Errorf("GET %s through the proxy: err %v, proxy asked %v; want a policy refusal before the proxy is asked", tt.url, err, asked)
				}
				return
			}
			if err != nil || !asked || resp.StatusCode != http.StatusBadGateway {
				t.Errorf("GET %s: err %v, proxy asked %v; want the proxy to be asked", tt.url, err, asked)
			}
		})
	}
}

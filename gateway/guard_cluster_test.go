package gateway_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/gateway"
)

// TestGatewayHostAndOriginChecks: with --allowed-hosts the gateway (API and console)
// answers only its names, IP addresses and localhost; a browser's cross-origin POST is
// refused whatever the Host; programs, which send no Origin, pass.
func TestGatewayHostAndOriginChecks(t *testing.T) {
	g := startGateway(t, cluster(t), gateway.Config{AllowedHosts: []string{"gw.example"}, Registerer: prometheus.NewRegistry()})
	do := func(method, path, host string, hdr ...string) (int, string) {
		req, _ := http.NewRequest(method, g.url+path, strings.NewReader(`{"model":"none","messages":[{"role":"user","content":"hi"}]}`))
		req.Host = host
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name, method, path, host string
		hdr                      []string
		refused                  string // the error code; "" when the request passes the checks
	}{
		{name: "a program by the gateway's name", method: "POST", path: "/v1/chat/completions", host: "gw.example"},
		{name: "a program by address", method: "POST", path: "/v1/chat/completions", host: strings.TrimPrefix(g.url, "http://")},
		{name: "the console by its name", method: "GET", path: "/ui/models", host: "gw.example"},
		{name: "a rebound name on the API", method: "POST", path: "/v1/chat/completions", host: "evil.example", refused: "host_not_allowed"},
		{name: "a rebound name on the console", method: "GET", path: "/ui/models", host: "evil.example:80", refused: "host_not_allowed"},
		{name: "a cross-site form", method: "POST", path: "/v1/chat/completions", host: "gw.example",
			hdr: []string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site", "Content-Type", "text/plain"}, refused: "cross_origin_refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := do(tt.method, tt.path, tt.host, tt.hdr...)
			if tt.refused == "" {
				if code == http.StatusForbidden {
					t.Errorf("refused: %d %s", code, body)
				}
				return
			}
			if code != http.StatusForbidden || !strings.Contains(body, tt.refused) {
				t.Errorf("%d %s; want 403 %s", code, body, tt.refused)
			}
		})
	}
}

package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/pki"
)

// certSource is a pki.Source with a certificate of ca for id (none for nil) and ca's
// bundle.
func certSource(t *testing.T, ca *pki.CA, id *pki.Identity) *pki.Source {
	t.Helper()
	src, err := ca.NewSource(id, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// TestClientCertificates: with ClientCertificates, a gateway's and the manager's
// certificates reach the whole API; a metrics scraper's reaches /metrics only; a
// Mac's own certificate reaches nothing (403); no
// certificate reaches the OpenAI API with a ServiceAccount token only; and only a
// gateway's queue reports count.
func TestClientCertificates(t *testing.T) {
	ca, err := pki.NewCA(time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const tenantToken = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ0ZW5hbnQifQ.c2ln"
	me := pki.Node("mac-1")
	a := startAgent(t, agentOptions{noRunner: true, serverCert: certSource(t, ca, &me),
		reviewToken: func(_ context.Context, tok string) (tenancy.Identity, error) {
			if tok == tenantToken {
				return tenancy.Identity{Namespace: "team-a", Name: "system:serviceaccount:team-a:app"}, nil
			}
			return tenancy.Identity{}, &satoken.RefusedError{Reason: "unknown token"}
		}})
	clientAs := func(id *pki.Identity) *http.Client {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = certSource(t, ca, id).ClientConfig(me)
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	gw, mgr, otherMac, scraper := pki.Gateway("gw"), pki.Manager("macfleet-manager"), pki.Node("mac-2"), pki.Metrics("prometheus")
	clients := map[string]*http.Client{"gateway": clientAs(&gw), "manager": clientAs(&mgr), "mac-2": clientAs(&otherMac), "scraper": clientAs(&scraper),
		"mac-1 itself": clientAs(&me), "none": clientAs(nil)}
	do := func(who, method, path, token string, header ...string) (int, string) {
		t.Helper()
		body := ""
		if method == http.MethodPost {
			body = `{"model":"tiny","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
		}
		req, _ := http.NewRequestWithContext(t.Context(), method, a.url+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := clients[who].Do(req)
		if err != nil {
			t.Fatalf("%s %s as %s: %v", method, path, who, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		who, method, path, token string
		status                   int
		contains                 string
	}{
		{who: "gateway", method: "GET", path: "/api/status", status: 200},
		{who: "manager", method: "GET", path: "/api/status", status: 200},
		{who: "gateway", method: "GET", path: "/v1/models", status: 200},
		{who: "mac-2", method: "GET", path: "/api/status", status: 403, contains: "macfleet://node/mac-2 may not call a node agent"},
		{who: "mac-2", method: "POST", path: "/api/models/tiny/unload", status: 403, contains: "forbidden_caller"},
		{who: "mac-2", method: "GET", path: "/v1/models", status: 403, contains: "forbidden_caller"},
		// A Mac's certificate with a tenant's token is still a Mac's.
		{who: "mac-2", method: "GET", path: "/v1/models", token: tenantToken, status: 403, contains: "forbidden_caller"},
		{who: "mac-1 itself", method: "POST", path: "/api/cache/clear", status: 403, contains: "forbidden_caller"},
		{who: "scraper", method: "GET", path: "/metrics", status: 200, contains: "macfleet_agent_memory_ceiling_bytes"},
		{who: "scraper", method: "GET", path: "/healthz", status: 200},
		{who: "scraper", method: "GET", path: "/api/status", status: 403, contains: "macfleet://metrics/prometheus may only scrape"},
		{who: "scraper", method: "POST", path: "/api/cache/clear", status: 403, contains: "forbidden_caller"},
		{who: "scraper", method: "POST", path: "/v1/chat/completions", status: 403, contains: "forbidden_caller"},
		// A scraper's certificate with a tenant's token is still a scraper's.
		{who: "scraper", method: "GET", path: "/v1/models", token: tenantToken, status: 403, contains: "forbidden_caller"},
		{who: "mac-2", method: "GET", path: "/metrics", status: 403, contains: "forbidden_caller"},
		// The prefix events are an admin read: the gateways and the manager only.
		{who: "gateway", method: "GET", path: "/api/models/tiny/prefixes", status: 503, contains: "the model is not loaded"},
		{who: "manager", method: "GET", path: "/api/models/tiny/prefixes", status: 503, contains: "the model is not loaded"},
		{who: "scraper", method: "GET", path: "/api/models/tiny/prefixes", status: 403, contains: "may only scrape"},
		{who: "mac-2", method: "GET", path: "/api/models/tiny/prefixes", status: 403, contains: "forbidden_caller"},
		{who: "scraper", method: "GET", path: "/api/models/tiny/prefixes", token: tenantToken, status: 403, contains: "forbidden_caller"},
		{who: "none", method: "GET", path: "/api/models/tiny/prefixes", token: tenantToken, status: 401, contains: "admin API takes only"},
		{who: "none", method: "GET", path: "/api/status", status: 401, contains: "missing credentials"},
		{who: "none", method: "GET", path: "/api/status", token: tenantToken, status: 401, contains: "admin API takes only a gateway's or the manager's certificate"},
		{who: "none", method: "GET", path: "/v1/models", token: tenantToken, status: 200},
		{who: "none", method: "GET", path: "/v1/models", token: "not-a-token", status: 401, contains: "invalid API key"},
		{who: "none", method: "GET", path: "/healthz", status: 200},
	} {
		if code, body := do(tc.who, tc.method, tc.path, tc.token); code != tc.status || !strings.Contains(body, tc.contains) {
			t.Errorf("%s %s as %s (token %t): %d %s, want %d containing %q", tc.method, tc.path, tc.who, tc.token != "", code, body, tc.status, tc.contains)
		}
	}

	// Queue reports: a tenant's are ignored, a gateway's count.
	report := func(who, token, gateway string) {
		do(who, http.MethodPost, "/v1/chat/completions", token, v1alpha1.HeaderQueued, "50", v1alpha1.HeaderGateway, gateway)
	}
	report("none", tenantToken, "forged")
	report("gateway", "", "gw")
	_, body := do("gateway", http.MethodGet, "/api/status", "")
	var st struct {
		GatewayQueues map[string][]struct{ Gateway string } `json:"gatewayQueues"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, qs := range st.GatewayQueues {
		for _, q := range qs {
			seen = append(seen, q.Gateway)
		}
	}
	if strings.Join(seen, ",") != "gw" {
		t.Errorf("queue reports recorded from %v, want only the gateway's (gw)", seen)
	}

	// Plain HTTP to the TLS listener is not served.
	if resp, err := http.Get(strings.Replace(a.url, "https://", "http://", 1) + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP was served")
		}
	}
}

package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/macfleet/macfleet/tenancy"
	"github.com/macfleet/macfleet/tenancy/satoken"
)

// TestServiceAccountTokens: a token-shaped credential that is not the fleet token is
// reviewed on the OpenAI API only. Accepted, it passes; refused, it is a 401 saying
// why; unreviewable, a 503 to retry; on the admin API it is a 401 without a review.
func TestServiceAccountTokens(t *testing.T) {
	const (
		key     = "fleet-k3y"
		good    = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJnb29kIn0.c2ln"
		refused = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJiYWQifQ.c2ln"
		broken  = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJkb3duIn0.c2ln"
	)
	var reviews atomic.Int32
	a := startAgent(t, agentOptions{noRunner: true, apiKey: key,
		reviewToken: func(_ context.Context, tok string) (tenancy.Identity, error) {
			reviews.Add(1)
			switch tok {
			case good:
				return tenancy.Identity{Namespace: "team-a", Name: "system:serviceaccount:ci"}, nil
			case refused:
				return tenancy.Identity{}, &satoken.RefusedError{Reason: "not authenticated: token has expired"}
			}
			return tenancy.Identity{}, errors.New("connection refused")
		}})
	for _, tc := range []struct {
		name, method, path, token string
		status                    int
		contains                  string
		reviewed                  bool
	}{
		{name: "accepted on the OpenAI API", method: "GET", path: "/v1/models", token: good, status: 200, reviewed: true},
		{name: "refused", method: "GET", path: "/v1/models", token: refused, status: 401, reviewed: true,
			contains: "invalid ServiceAccount token: not authenticated: token has expired"},
		{name: "not reviewable", method: "POST", path: "/v1/chat/completions", token: broken, status: 503, reviewed: true,
			contains: "token_review_unavailable"},
		{name: "unload", method: "POST", path: "/api/models/tiny/unload", token: good, status: 401,
			contains: "admin API takes only the fleet token"},
		{name: "cache clear", method: "POST", path: "/api/cache/clear", token: good, status: 401,
			contains: "admin API takes only the fleet token"},
		{name: "status", method: "GET", path: "/api/status", token: good, status: 401, contains: "admin API takes only the fleet token"},
		{name: "metrics", method: "GET", path: "/metrics", token: good, status: 401, contains: "admin API takes only the fleet token"},
		{name: "the fleet token on the admin API", method: "GET", path: "/api/status", token: key, status: 200},
		{name: "a key-shaped wrong credential is not reviewed", method: "GET", path: "/v1/models", token: "0123456789abcdef0123",
			status: 401, contains: "invalid API key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := reviews.Load()
			req, err := http.NewRequestWithContext(t.Context(), tc.method, a.url+tc.path, strings.NewReader(""))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+tc.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.contains) {
				t.Errorf("%s %s: %d %s, want %d containing %q", tc.method, tc.path, resp.StatusCode, body, tc.status, tc.contains)
			}
			if tc.status == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
				t.Errorf("a 503 without Retry-After")
			}
			if got := reviews.Load() != before; got != tc.reviewed {
				t.Errorf("reviewed %v, want %v", got, tc.reviewed)
			}
		})
	}
}

package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/macfleet/macfleet/agent/clustermode"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
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
			contains: "admin API takes only the API key"},
		{name: "cache clear", method: "POST", path: "/api/cache/clear", token: good, status: 401,
			contains: "admin API takes only the API key"},
		{name: "status", method: "GET", path: "/api/status", token: good, status: 401, contains: "admin API takes only the API key"},
		{name: "metrics", method: "GET", path: "/metrics", token: good, status: 401, contains: "admin API takes only the API key"},
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

// TestDirectCallersAreMetered: the answers to a ServiceAccount served directly count
// in the usage counters the gateway exports, with the usage the client received,
// under the caller's namespace and name and the entry's deployment; the fleet token's
// (the gateway's own requests, which the gateway counts) do not. A caller the
// resolver sends to the gateway gets a 403 in the OpenAI shape on chat and the
// Anthropic shape on Messages, and counts nothing.
func TestDirectCallersAreMetered(t *testing.T) {
	const (
		key      = "fleet-k3y"
		direct   = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln"
		budgeted = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJiIn0.c2ln"
	)
	a := startAgent(t, agentOptions{apiKey: key,
		reviewToken: func(_ context.Context, tok string) (tenancy.Identity, error) {
			switch tok {
			case direct:
				return tenancy.Identity{Namespace: "team-a", Name: "system:serviceaccount:ci"}, nil
			case budgeted:
				return tenancy.Identity{Namespace: "team-b", Name: "system:serviceaccount:ci"}, nil
			}
			return tenancy.Identity{}, &satoken.RefusedError{Reason: "unknown"}
		},
		resolveModel: func(r *http.Request, model string) (string, error) {
			if id, _ := tenancy.IdentityFrom(r.Context()); id.Namespace == "team-b" {
				return "", &clustermode.ThroughGatewayError{Namespace: "team-b", Deployment: "team-a/tiny"}
			}
			return model, nil
		},
		deploymentOf: func(entry string) string { return "team-a/" + entry },
	})
	labels := []string{"namespace", "team-a", "key", "system:serviceaccount:ci", "deployment", "team-a/tiny"}
	var want metering.Usage
	var requests float64
	for _, tc := range []struct {
		token  string
		stream bool
		counts bool
	}{{direct, false, true}, {direct, true, true}, {key, false, false}, {key, true, false}} {
		body := chatBody("tiny", 5, tc.stream)
		if tc.stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		resp, b := a.do(http.MethodPost, "/v1/chat/completions", body, "Authorization", "Bearer "+tc.token)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat (stream %v): %d %s", tc.stream, resp.StatusCode, b)
		}
		u := answeredUsage(t, b, tc.stream)
		if u.Input == 0 || u.Output == 0 {
			t.Fatalf("no usage in the answer: %s", b)
		}
		if tc.counts {
			want, requests = want.Add(u), requests+1
		}
	}
	a.expectMetric(requests, "macfleet_usage_requests_total", labels...)
	a.expectMetric(float64(want.Input), "macfleet_usage_tokens_total", append(labels, "type", "input")...)
	a.expectMetric(float64(want.Output), "macfleet_usage_tokens_total", append(labels, "type", "output")...)
	if cached, _ := a.metric("macfleet_usage_tokens_total", append(labels, "type", "cached")...); cached != float64(want.Cached) {
		t.Errorf("cached tokens counted %v, answered %d", cached, want.Cached)
	}
	if n, ok := a.metric("macfleet_usage_requests_total", "namespace", ""); ok {
		t.Errorf("the fleet token's answers were counted on the agent (%v): the gateway counts them", n)
	}

	resp, b := a.do(http.MethodPost, "/v1/chat/completions", chatBody("tiny", 5, false), "Authorization", "Bearer "+budgeted)
	if e := decodeError(t, b); resp.StatusCode != http.StatusForbidden || e.Error.Code != "budgeted_namespace" ||
		!strings.Contains(e.Error.Message, "TokenBudget") || !strings.Contains(e.Error.Message, "gateway") {
		t.Errorf("budgeted chat: %d %s, want a 403 naming the TokenBudget and the gateway", resp.StatusCode, b)
	}
	msg := map[string]any{"model": "tiny", "max_tokens": 5, "messages": []map[string]string{{"role": "user", "content": "hi"}}}
	resp, b = a.do(http.MethodPost, "/v1/messages", msg, "Authorization", "Bearer "+budgeted)
	var anth struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &anth); err != nil || resp.StatusCode != http.StatusForbidden || anth.Type != "error" ||
		anth.Error.Type != "permission_error" || !strings.Contains(anth.Error.Message, "gateway") {
		t.Errorf("budgeted messages: %d %s, want a 403 in the Anthropic shape naming the gateway", resp.StatusCode, b)
	}
	if n, ok := a.metric("macfleet_usage_requests_total", "namespace", "team-b"); ok {
		t.Errorf("a refused caller was counted: %v", n)
	}
}

// answeredUsage is the usage of a chat answer: its usage field, or a stream's last
// usage chunk.
func answeredUsage(t *testing.T, b []byte, stream bool) metering.Usage {
	t.Helper()
	var chunks [][]byte
	if !stream {
		chunks = [][]byte{b}
	}
	for line := range strings.Lines(string(b)) {
		if d, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); stream && ok && d != "[DONE]" {
			chunks = append(chunks, []byte(d))
		}
	}
	var u metering.Usage
	for _, c := range chunks {
		var a struct {
			Usage *runnerapi.Usage `json:"usage"`
		}
		if err := json.Unmarshal(c, &a); err != nil {
			t.Fatalf("answer %s: %v", c, err)
		}
		if a.Usage != nil {
			u = metering.Usage{Input: int64(a.Usage.PromptTokens), Output: int64(a.Usage.CompletionTokens)}
			if d := a.Usage.PromptTokensDetails; d != nil {
				u.Cached = int64(d.CachedTokens)
			}
		}
	}
	return u
}

package server_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/internal/version"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// TestErrorStatuses checks the status, OpenAI error body and headers of every request
// the agent refuses before touching a runner.
func TestErrorStatuses(t *testing.T) {
	const key = "k3y"
	a := startAgent(t, agentOptions{noRunner: true, apiKey: key, maxBody: 4096})
	auth := []string{"Authorization", "Bearer " + key}
	msgs := `"messages":[{"role":"user","content":"hi"}]`

	tests := []struct {
		name         string
		method, path string
		body         string
		header       []string
		status       int
		code, param  string
		errType      string
		wantHeader   [2]string
		msgContains  string
	}{
		{name: "invalid JSON", method: "POST", path: "/v1/chat/completions", body: `{"model":`, header: auth,
			status: 400, code: "invalid_json", errType: "invalid_request_error"},
		{name: "wrong type", method: "POST", path: "/v1/chat/completions", body: `{"model":"tiny","messages":"hi"}`, header: auth,
			status: 400, code: "invalid_value", param: "messages", errType: "invalid_request_error"},
		{name: "missing model", method: "POST", path: "/v1/chat/completions", body: `{` + msgs + `}`, header: auth,
			status: 400, code: "missing_required_parameter", param: "model", errType: "invalid_request_error"},
		{name: "no messages", method: "POST", path: "/v1/chat/completions", body: `{"model":"tiny","messages":[]}`, header: auth,
			status: 400, code: "missing_required_parameter", param: "messages", errType: "invalid_request_error"},
		{name: "bad role", method: "POST", path: "/v1/chat/completions", body: `{"model":"tiny","messages":[{"role":"wizard","content":"x"}]}`,
			header: auth, status: 400, code: "invalid_value", param: "messages[0].role", errType: "invalid_request_error"},
		{name: "temperature out of range", method: "POST", path: "/v1/chat/completions",
			body: `{"model":"tiny",` + msgs + `,"temperature":3}`, header: auth,
			status: 400, code: "invalid_value", param: "temperature", errType: "invalid_request_error"},
		{name: "stream_options without stream", method: "POST", path: "/v1/chat/completions",
			body: `{"model":"tiny",` + msgs + `,"stream_options":{"include_usage":true}}`, header: auth,
			status: 400, code: "invalid_value", param: "stream_options", errType: "invalid_request_error"},
		{name: "completion without prompt", method: "POST", path: "/v1/completions", body: `{"model":"tiny"}`, header: auth,
			status: 400, code: "missing_required_parameter", param: "prompt", errType: "invalid_request_error"},
		{name: "embeddings bad format", method: "POST", path: "/v1/embeddings",
			body: `{"model":"tiny","input":"x","encoding_format":"hex"}`, header: auth,
			status: 400, code: "invalid_value", param: "encoding_format", errType: "invalid_request_error"},
		{name: "missing key", method: "POST", path: "/v1/chat/completions", body: `{"model":"tiny",` + msgs + `}`,
			status: 401, code: "invalid_api_key", errType: "authentication_error",
			wantHeader: [2]string{"WWW-Authenticate", `Bearer realm="macfleet"`}, msgContains: "missing API key"},
		{name: "wrong key", method: "GET", path: "/api/status", header: []string{"Authorization", "Bearer nope"},
			status: 401, code: "invalid_api_key", errType: "authentication_error",
			wantHeader: [2]string{"WWW-Authenticate", `Bearer realm="macfleet"`}, msgContains: "invalid API key"},
		{name: "a wrong key as x-api-key", method: "GET", path: "/api/status", header: []string{"X-Api-Key", "nope"},
			status: 401, code: "invalid_api_key", errType: "authentication_error", msgContains: "x-api-key"},
		{name: "the key as x-api-key", method: "POST", path: "/v1/completions", body: `{"model":"tiny"}`,
			header: []string{"X-Api-Key", auth[1][len("Bearer "):]},
			status: 400, code: "missing_required_parameter", param: "prompt", errType: "invalid_request_error"},
		{name: "metrics need the key", method: "GET", path: "/metrics", status: 401, code: "invalid_api_key",
			errType: "authentication_error"},
		{name: "unknown model", method: "POST", path: "/v1/chat/completions", body: `{"model":"gpt-9",` + msgs + `}`, header: auth,
			status: 404, code: "model_not_found", errType: "invalid_request_error", msgContains: `"gpt-9"`},
		{name: "unknown model to embed", method: "POST", path: "/v1/embeddings", body: `{"model":"gpt-9","input":"x"}`, header: auth,
			status: 404, code: "model_not_found", errType: "invalid_request_error"},
		{name: "unknown model to load", method: "POST", path: "/api/models/gpt-9/load", header: auth,
			status: 404, code: "model_not_found", errType: "invalid_request_error"},
		{name: "unknown model to unload", method: "POST", path: "/api/models/gpt-9/unload", header: auth,
			status: 404, code: "model_not_found", errType: "invalid_request_error"},
		{name: "unknown route", method: "GET", path: "/v2/everything", header: auth,
			status: 404, code: "not_found", errType: "invalid_request_error"},
		{name: "wrong method", method: "GET", path: "/v1/chat/completions", header: auth,
			status: 405, code: "method_not_allowed", errType: "invalid_request_error"},
		{name: "body over the limit", method: "POST", path: "/v1/chat/completions",
			body: `{"model":"tiny","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, header: auth,
			status: 413, code: "request_too_large", errType: "invalid_request_error", msgContains: "4.0 KiB"},
		{name: "bad wait parameter", method: "POST", path: "/api/models/tiny/unload?wait=soon", header: auth,
			status: 400, code: "invalid_value", param: "wait", errType: "invalid_request_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body any
			if tt.body != "" {
				body = tt.body
			}
			resp, b := a.do(tt.method, tt.path, body, tt.header...)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			e := decodeError(t, b)
			if e.Error.Code != tt.code || e.Error.Type != tt.errType {
				t.Errorf("code/type = %q/%q, want %q/%q (%s)", e.Error.Code, e.Error.Type, tt.code, tt.errType, e.Error.Message)
			}
			param := ""
			if e.Error.Param != nil {
				param = *e.Error.Param
			}
			if param != tt.param {
				t.Errorf("param = %q, want %q", param, tt.param)
			}
			if tt.wantHeader[0] != "" && resp.Header.Get(tt.wantHeader[0]) != tt.wantHeader[1] {
				t.Errorf("%s = %q, want %q", tt.wantHeader[0], resp.Header.Get(tt.wantHeader[0]), tt.wantHeader[1])
			}
			if !strings.Contains(e.Error.Message, tt.msgContains) {
				t.Errorf("message %q does not mention %q", e.Error.Message, tt.msgContains)
			}
		})
	}

	// The health probes need no key.
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp, b := a.do(http.MethodGet, p, nil); resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s without a key: %d %s", p, resp.StatusCode, b)
		}
	}
	a.srv.SetReady(false)
	if resp, _ := a.do(http.MethodGet, "/readyz", nil); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz when not ready: %d, want 503", resp.StatusCode)
	}
	// Refusals are counted: the unknown model under no model label, the 400s too.
	a.expectMetric(2, "macfleet_agent_requests_total", "model", "", "code", "404")
	s := a.status()
	if s.Runners != 0 || s.Loads != 0 {
		t.Errorf("refused requests started %d runners (%d loads); want none", s.Runners, s.Loads)
	}
	// /api/status names the agent's build, as `macfleet version` prints it.
	if want := version.Get().Version; s.Version != want {
		t.Errorf("/api/status version %q, want %q", s.Version, want)
	}
}

// TestModelTooLarge: a model whose estimate exceeds the pool ceiling is refused with
// 507 model_too_large, naming the binding ceiling and the fix, without starting a runner.
func TestModelTooLarge(t *testing.T) {
	const ceiling = 64 << 20
	// The agent's own footprint is left out so no memory pressure races the refusal.
	a := startAgent(t, agentOptions{noRunner: true, pool: enginepool.Config{CeilingBytes: ceiling, AgentPID: -1},
		specs: []enginepool.ModelSpec{tinySpec(t, config.Model{Name: "huge", Memory: 1 << 30})}})
	for _, req := range []struct{ method, path, body string }{
		{"POST", "/v1/chat/completions", `{"model":"huge","messages":[{"role":"user","content":"hi"}]}`},
		{"POST", "/api/models/huge/load", ""},
	} {
		var body any
		if req.body != "" {
			body = req.body
		}
		resp, b := a.do(req.method, req.path, body)
		if resp.StatusCode != http.StatusInsufficientStorage {
			t.Fatalf("%s: status %d, want 507: %s", req.path, resp.StatusCode, b)
		}
		e := decodeError(t, b)
		if e.Error.Code != "model_too_large" || e.Error.Type != "insufficient_storage" {
			t.Errorf("%s: code/type %q/%q, want model_too_large/insufficient_storage", req.path, e.Error.Code, e.Error.Type)
		}
		if e.Error.CeilingBound != "configured" || e.Error.LimitBytes != ceiling || e.Error.EstimatedBytes != 1<<30 {
			t.Errorf("%s: bound %q limit %d estimated %d; want configured, %d, %d", req.path,
				e.Error.CeilingBound, e.Error.LimitBytes, e.Error.EstimatedBytes, ceiling, 1<<30)
		}
		for _, want := range []string{"configured ceiling", "fix:"} {
			if !strings.Contains(e.Error.Message, want) {
				t.Errorf("%s: message %q does not say %q", req.path, e.Error.Message, want)
			}
		}
	}
	if s := a.status(); s.Runners != 0 {
		t.Errorf("%d runners started for a model that cannot fit", s.Runners)
	}
	a.expectMetric(1, "macfleet_agent_requests_total", "model", "huge", "code", "507")
}

// TestPressureMetrics: with a ceiling below what the agent itself uses, the enforcer
// reports hard, then emergency, pressure; the gauges show usage and the ceiling.
func TestPressureMetrics(t *testing.T) {
	const ceiling = 1 << 20
	a := startAgent(t, agentOptions{noRunner: true, pool: enginepool.Config{CeilingBytes: ceiling}})
	eventually(t, 30*time.Second, "emergency pressure", func() bool {
		n, _ := a.metric(enginepool.MetricMemoryPressure)
		return n == 3
	})
	if n, _ := a.metric(enginepool.MetricMemoryUsed); n <= ceiling {
		t.Errorf("memory_used_bytes = %v, want above the %d ceiling (the agent's own footprint)", n, ceiling)
	}
	if n, ok := a.metric(enginepool.MetricMemoryCeiling, "bound", "configured"); !ok || n != ceiling {
		t.Errorf(`memory_ceiling_bytes{bound="configured"} = %v (%v), want %d`, n, ok, ceiling)
	}
	if s := a.status(); s.Pressure != enginepool.PressureEmergency {
		t.Errorf("/api/status pressure %q, want emergency", s.Pressure)
	}
}

package translate

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// checkingChat answers as the runner's chat endpoint does: a request it refuses gets
// the runner's error, one it accepts fakeChat's answer.
type checkingChat struct {
	fakeChat
	refused *runnerapi.Error
	form    bool // refused while decoding: the request's form, not a value
}

func (c *checkingChat) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req runnerapi.ChatRequest
	e := runnerapi.DecodeJSON(b, &req)
	c.form = e != nil
	if e == nil {
		_, e = req.Options()
	}
	if e == nil {
		e = req.Check()
	}
	if e != nil {
		c.refused = e
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(e.Status)
		_ = json.NewEncoder(w).Encode(e)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	c.fakeChat.ServeHTTP(w, r)
}

// fuzzTranslation: any body gets 200 or a client error in the API's own shape, and
// what the translation forwards is never refused for its form (a field the chat API
// does not know, a value of the wrong JSON type): a client's bad value may be left to
// the chat API to refuse, a translation's own mistake may not.
func fuzzTranslation(t *testing.T, h func(http.Handler) http.Handler, path string, body []byte, errShape func(map[string]any) bool) {
	c := &checkingChat{fakeChat: fakeChat{whole: toolWhole, chunks: toolStream}}
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- post(t, h(c), path, string(body)) }()
	var w *httptest.ResponseRecorder
	select {
	case w = <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s %s: no answer in 5s", path, body)
	}
	if e := c.refused; e != nil && c.form {
		forwarded, _ := json.Marshal(c.got)
		t.Fatalf("%s %s was translated into a chat request refused for its form: %s\n%s", path, body, e.Message, forwarded)
	}
	if w.Code == http.StatusOK && c.refused == nil {
		return
	}
	var e map[string]any
	if w.Code < 400 || w.Code >= 500 || json.Unmarshal(w.Body.Bytes(), &e) != nil || !errShape(e) {
		t.Fatalf("%s %s: answered %d %s; want 200 or a client error in the API's shape", path, body, w.Code, w.Body)
	}
}

func FuzzAnthropicRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":50,"system":[{"type":"text","text":"Be brief."}],"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],` +
		`"tool_choice":{"type":"any","disable_parallel_tool_use":true},"thinking":{"type":"enabled","budget_tokens":1024},"stop_sequences":["END"],` +
		`"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"21 C"}]}]}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Hello"}]}`))
	// The shape of Claude Code's requests (issue 28).
	f.Add([]byte(`{"model":"m","max_tokens":64,"stream":true,"thinking":{"type":"adaptive"},"output_config":{"effort":"high"},` +
		`"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},"metadata":{"user_id":"u"},` +
		`"system":[{"type":"text","text":"S","cache_control":{"type":"ephemeral"}}],"tools":[{"name":"Bash","input_schema":{"type":"object"}},` +
		`{"type":"web_search_20250305","name":"web_search","max_uses":2}],"messages":[{"role":"user","content":"Hi"},` +
		`{"role":"system","content":"Reminder."},{"role":"assistant","content":"Hello"},{"role":"user","content":[{"type":"text","text":"Go","cache_control":{"type":"ephemeral"}}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzTranslation(t, Anthropic, "/v1/messages", body, func(e map[string]any) bool {
			inner, _ := e["error"].(map[string]any)
			msg, _ := inner["message"].(string)
			return e["type"] == "error" && inner["type"] != nil && msg != ""
		})
	})
}

func FuzzResponsesRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","instructions":"Be brief.","input":"Hello"}`))
	f.Add([]byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"Weather?"}]},` +
		`{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},` +
		`{"type":"function_call_output","call_id":"c1","output":"21 C"}],"tools":[{"type":"function","name":"get_weather",` +
		`"parameters":{"type":"object"}}],"tool_choice":"required","text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}},"stream":true}`))
	// The shape of Codex's requests (issue 28).
	f.Add([]byte(`{"model":"m","stream":true,"store":false,"prompt_cache_key":"t","include":["reasoning.encrypted_content"],` +
		`"client_metadata":{"session_id":"s"},"reasoning":{"summary":"auto"},"tool_choice":"auto","parallel_tool_calls":true,` +
		`"tools":[{"type":"function","name":"exec_command","parameters":{"type":"object"},"strict":false},{"type":"namespace","name":"ns",` +
		`"description":"","tools":[{"type":"function","name":"spawn","parameters":{"type":"object"}}]},{"type":"web_search","external_web_access":false}],` +
		`"input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"D"}]},{"type":"reasoning","id":"rs","summary":[],` +
		`"encrypted_content":"x"},{"type":"function_call","call_id":"c","namespace":"ns","name":"spawn","arguments":"{}"},` +
		`{"type":"function_call_output","call_id":"c","output":"ok"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzTranslation(t, Responses, "/v1/responses", body, func(e map[string]any) bool {
			inner, _ := e["error"].(map[string]any)
			msg, _ := inner["message"].(string)
			return msg != ""
		})
	})
}

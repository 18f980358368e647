package translate

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/macfleet/macfleet/runner/api"
)

// checkingChat answers as the runner's chat endpoint does: a request it refuses gets
// the runner's error, one it accepts fakeChat's answer.
type checkingChat struct {
	fakeChat
	refused *api.Error
	form    bool // refused while decoding: the request's form, not a value
}

func (c *checkingChat) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req api.ChatRequest
	e := api.DecodeJSON(b, &req)
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
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzTranslation(t, Responses, "/v1/responses", body, func(e map[string]any) bool {
			inner, _ := e["error"].(map[string]any)
			msg, _ := inner["message"].(string)
			return msg != ""
		})
	})
}

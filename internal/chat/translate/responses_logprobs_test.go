package translate

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// lpChunk is a chat chunk whose delta is delta, carrying the logprobs of tokens.
func lpChunk(delta string, tokens ...string) string {
	var lps []string
	for _, tok := range tokens {
		lps = append(lps, fmt.Sprintf(`{"token":%q,"logprob":-0.5,"bytes":[1],"top_logprobs":[{"token":%q,"logprob":-0.5,"bytes":[1]}]}`, tok, tok))
	}
	return fmt.Sprintf(`{"id":"chatcmpl-1","model":"m","choices":[{"index":0,"delta":%s,"logprobs":{"content":[%s],"refusal":[]}}]}`,
		delta, strings.Join(lps, ","))
}

// lpTokens are the tokens of a logprobs field.
func lpTokens(v any) []string {
	l, _ := v.([]any)
	out := []string{}
	for _, e := range l {
		out = append(out, e.(map[string]any)["token"].(string))
	}
	return out
}

// TestResponsesLogprobs: include message.output_text.logprobs (or top_logprobs) asks
// the chat for logprobs; each output_text.delta carries its tokens' logprobs, a
// reasoning chunk's are not reported, those that came without text (held tokens at
// the end) go with the done events, which with the response carry all of the
// message's; a whole answer's message carries them too.
func TestResponsesLogprobs(t *testing.T) {
	stream := []string{
		`{"id":"chatcmpl-1","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		lpChunk(`{"reasoning_content":"Hm"}`, "Hm"),
		lpChunk(`{"content":"Hel"}`, "Hel"),
		lpChunk(`{"content":"lo"}`, "l", "o"),
		strings.Replace(lpChunk(`{}`, "!"), `"logprobs"`, `"finish_reason":"stop","logprobs"`, 1),
		`{"id":"chatcmpl-1","model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`,
	}
	fc := &fakeChat{chunks: stream}
	w := post(t, Responses(fc), "/v1/responses",
		`{"model":"m","stream":true,"input":"hi","include":["message.output_text.logprobs"],"top_logprobs":1}`)
	if fc.got["logprobs"] != true || fc.got["top_logprobs"] != 1.0 {
		t.Errorf("the chat request %v, want logprobs with top_logprobs 1", fc.got)
	}
	var deltas [][]string
	var done, part, final []string
	for _, e := range readEvents(t, w.Body) {
		switch e.event {
		case "response.output_text.delta":
			deltas = append(deltas, lpTokens(e.data["logprobs"]))
		case "response.output_text.done":
			done = lpTokens(e.data["logprobs"])
		case "response.content_part.done":
			if p := e.data["part"].(map[string]any); p["type"] == "output_text" {
				part = lpTokens(p["logprobs"])
			}
		case "response.completed":
			out := e.data["response"].(map[string]any)["output"].([]any)
			final = lpTokens(out[len(out)-1].(map[string]any)["content"].([]any)[0].(map[string]any)["logprobs"])
		}
	}
	whole := []string{"Hel", "l", "o", "!"}
	if fmt.Sprint(deltas) != "[[Hel] [l o]]" || !slices.Equal(done, whole) || !slices.Equal(part, whole) || !slices.Equal(final, whole) {
		t.Errorf("logprobs: deltas %v, done %v, part %v, response %v; want [[Hel] [l o]] and %v", deltas, done, part, final, whole)
	}

	hel := "Hello"
	fc = &fakeChat{whole: runnerapi.ChatCompletion{ID: "chatcmpl-1", Model: "m", Choices: []runnerapi.ChatChoice{{
		Message: runnerapi.ChatMessageOut{Role: "assistant", Content: &hel}, FinishReason: "stop",
		Logprobs: &runnerapi.ChatLogprobs{Content: []runnerapi.TokenLogprob{{Token: "Hel"}, {Token: "lo"}}}}}}}
	w = post(t, Responses(fc), "/v1/responses", `{"model":"m","input":"hi","top_logprobs":2}`)
	var resp struct {
		Output []struct {
			Content []struct {
				Logprobs []runnerapi.TokenLogprob `json:"logprobs"`
			} `json:"content"`
		} `json:"output"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || len(resp.Output) != 1 || len(resp.Output[0].Content) != 1 ||
		len(resp.Output[0].Content[0].Logprobs) != 2 || fc.got["logprobs"] != true || fc.got["top_logprobs"] != 2.0 {
		t.Errorf("whole answer %s (chat request %v), want the message's two tokens' logprobs", w.Body, fc.got)
	}
	fc = &fakeChat{whole: fc.whole}
	post(t, Responses(fc), "/v1/responses", `{"model":"m","input":"hi"}`)
	if _, ok := fc.got["logprobs"]; ok {
		t.Errorf("logprobs asked without include or top_logprobs: %v", fc.got)
	}
}

// TestResumeResponsesLogprobs: a Responses stream resumed in its message goes on with
// the logprobs of the text the client has, which the gateway sends back as the
// output_text part's logprobs of the final assistant message: its deltas carry only
// the continuation's tokens, its done events and the response every token once.
func TestResumeResponsesLogprobs(t *testing.T) {
	fc := &fakeChat{chunks: []string{
		`{"id":"chatcmpl-2","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		lpChunk(`{"content":" world"}`, " world"),
		`{"id":"chatcmpl-2","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
	}}
	part := `{"type":"output_text","text":"Hello","annotations":[],"logprobs":[{"token":"Hel","logprob":-1,"bytes":[72],"top_logprobs":[]},` +
		`{"token":"lo","logprob":-1,"bytes":[108],"top_logprobs":[]}]}`
	r := httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(`{"model":"m","stream":true,`+
		`"include":["message.output_text.logprobs"],"input":[{"role":"user","content":"hi"},{"role":"assistant","content":[`+part+`]}]}`))
	r.Header.Set(runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage)
	r.Header.Set(runnerapi.HeaderResumeStream, `{"id":"resp_old","created_at":7,"seq":5,"item":"msg_old_1"}`)
	w := httptest.NewRecorder()
	Responses(fc).ServeHTTP(w, r)
	msgs, _ := fc.got["messages"].([]any)
	if len(msgs) != 2 || msgs[1].(map[string]any)["content"] != "Hello" {
		t.Errorf("the chat's messages %v, want the assistant's text as its final message", msgs)
	}
	var deltas, done []string
	for _, e := range readEvents(t, w.Body) {
		switch e.event {
		case "response.output_text.delta":
			deltas = append(deltas, lpTokens(e.data["logprobs"])...)
		case "response.output_text.done":
			done = lpTokens(e.data["logprobs"])
		}
	}
	if !slices.Equal(deltas, []string{" world"}) || !slices.Equal(done, []string{"Hel", "lo", " world"}) {
		t.Errorf("deltas' logprobs %q, done %q; want the continuation's, then every token once", deltas, done)
	}
}

package translate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// countedChat streams a continued answer's chat chunks, each after a count line of
// the runner's (runnerapi.HeaderTokenCounts), and records the request's headers.
type countedChat struct{ header http.Header }

func (c *countedChat) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.header = r.Header.Clone()
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range []string{
		`data: {"id":"chatcmpl-new","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		runnerapi.TokenCountComment + " 0 1\n" + `data: {"id":"chatcmpl-new","model":"m","choices":[{"index":0,"delta":{"content":" world"}}]}`,
		runnerapi.TokenCountComment + " 0 2\n" + `data: {"id":"chatcmpl-new","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`data: {"id":"chatcmpl-new","model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":5,"total_tokens":9}}`,
		`data: [DONE]`,
	} {
		_, _ = io.WriteString(w, ev+"\n\n")
	}
}

// resumed posts body to h as the gateway continues a stream at resume.
func resumed(t *testing.T, h http.Handler, path, body, resume string) string {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	r.Header.Set(runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage)
	r.Header.Set(runnerapi.HeaderResumeStream, resume)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	return w.Body.String()
}

// eventKinds lists a stream's events as "kind" or "kind@seq", the count lines as
// "count N".
func eventKinds(t *testing.T, body string) []string {
	t.Helper()
	var kinds []string
	for line := range strings.SplitSeq(body, "\n") {
		if n, ok := strings.CutPrefix(line, runnerapi.TokenCountComment+" 0 "); ok {
			kinds = append(kinds, "count "+n)
		}
	}
	for _, e := range readEvents(t, strings.NewReader(body)) {
		kinds = append(kinds, e.event)
	}
	return kinds
}

// TestResumeResponsesStream: a Responses stream resumed at an open message item goes
// on with the client's response id, created_at, sequence numbers and item, its done
// events carry the whole text (the final assistant message's and what follows), no
// event of a new response is sent, and the runner's counts go before the events.
func TestResumeResponsesStream(t *testing.T) {
	c := &countedChat{}
	body := resumed(t, Responses(c), "/v1/responses",
		`{"model":"m","stream":true,"input":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hello"}]}`,
		`{"id":"resp_old","created_at":7,"seq":5,"item":"msg_old_1"}`)
	if c.header.Get(runnerapi.HeaderContinue) != runnerapi.ContinueFinalMessage {
		t.Errorf("the chat request's headers %v lack %s", c.header, runnerapi.HeaderContinue)
	}
	events := readEvents(t, strings.NewReader(body))
	want := []string{"response.output_text.delta", "response.output_text.done", "response.content_part.done",
		"response.output_item.done", "response.completed"}
	if len(events) != len(want) {
		t.Fatalf("events %v, want %v\n%s", eventKinds(t, body), want, body)
	}
	for i, e := range events {
		if e.event != want[i] || e.data["sequence_number"] != float64(5+i) {
			t.Errorf("event %d: %s #%v, want %s #%d", i, e.event, e.data["sequence_number"], want[i], 5+i)
		}
		if id, ok := e.data["item_id"]; ok && id != "msg_old_1" {
			t.Errorf("event %d: item %v, want msg_old_1", i, id)
		}
	}
	if got := events[1].data["text"]; got != "Hello world" {
		t.Errorf("output_text.done text %q, want the whole text", got)
	}
	resp := events[4].data["response"].(map[string]any)
	out := resp["output"].([]any)[0].(map[string]any)
	if resp["id"] != "resp_old" || resp["created_at"] != 7.0 || resp["model"] != "m" || out["id"] != "msg_old_1" ||
		out["content"].([]any)[0].(map[string]any)["text"] != "Hello world" {
		t.Errorf("response %v", resp)
	}
	if !strings.HasPrefix(body, runnerapi.TokenCountComment+" 0 1\nevent: response.output_text.delta\n") ||
		!strings.Contains(body, runnerapi.TokenCountComment+" 0 2\nevent: response.output_text.done\n") {
		t.Errorf("the counts do not go before the events they count:\n%s", body)
	}
}

// TestResumeMessagesStream: a Messages stream resumed in an open text block goes on
// in that block, without a new message_start or content_block_start; one resumed
// before any block opens the first one at its index.
func TestResumeMessagesStream(t *testing.T) {
	for _, tc := range []struct {
		resume string
		want   string
	}{
		{`{"index":0,"open":true}`, "content_block_delta content_block_stop message_delta message_stop"},
		{`{}`, "content_block_start content_block_delta content_block_stop message_delta message_stop"},
	} {
		body := resumed(t, Anthropic(&countedChat{}), "/v1/messages",
			`{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hello"}]}`,
			tc.resume)
		var kinds []string
		for _, e := range readEvents(t, strings.NewReader(body)) {
			kinds = append(kinds, e.event)
			if idx, ok := e.data["index"]; ok && idx != 0.0 {
				t.Errorf("%s: %s at index %v, want 0", tc.resume, e.event, idx)
			}
		}
		if got := strings.Join(kinds, " "); got != tc.want {
			t.Errorf("%s: events %s, want %s", tc.resume, got, tc.want)
		}
	}
}

// TestResumeNeedsContinue: the resume header alone (no runnerapi.HeaderContinue)
// starts a new stream.
func TestResumeNeedsContinue(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/v1/messages",
		strings.NewReader(`{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	r.Header.Set(runnerapi.HeaderResumeStream, `{"index":0,"open":true}`)
	w := httptest.NewRecorder()
	Anthropic(&countedChat{}).ServeHTTP(w, r)
	if events := readEvents(t, w.Body); len(events) == 0 || events[0].event != "message_start" {
		t.Errorf("events %v, want a new message", events)
	}
}

// thinkingChat streams a continued answer's reasoning, then its text.
type thinkingChat struct{}

func (thinkingChat) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range []string{
		`data: {"id":"chatcmpl-new","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`data: {"id":"chatcmpl-new","model":"m","choices":[{"index":0,"delta":{"reasoning_content":" more"}}]}`,
		`data: {"id":"chatcmpl-new","model":"m","choices":[{"index":0,"delta":{"content":"Done"}}]}`,
		`data: {"id":"chatcmpl-new","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`data: [DONE]`,
	} {
		_, _ = io.WriteString(w, ev+"\n\n")
	}
}

// TestResumeMessagesThinking: a Messages stream resumed in an open thinking block (the
// answer continued has a thinking block and no text yet) goes on in that block, then
// opens its text block after it.
func TestResumeMessagesThinking(t *testing.T) {
	body := resumed(t, Anthropic(thinkingChat{}), "/v1/messages",
		`{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"},`+
			`{"role":"assistant","content":[{"type":"thinking","thinking":"Let me think","signature":""}]}]}`,
		`{"index":0,"open":true}`)
	var got []string
	for _, e := range readEvents(t, strings.NewReader(body)) {
		kind := e.event
		if idx, ok := e.data["index"]; ok {
			kind = fmt.Sprintf("%s@%v", kind, idx)
		}
		if d, ok := e.data["delta"].(map[string]any); ok && d["type"] != nil {
			kind += ":" + d["type"].(string)
		}
		got = append(got, kind)
	}
	want := []string{"content_block_delta@0:thinking_delta", "content_block_stop@0", "content_block_start@1",
		"content_block_delta@1:text_delta", "content_block_stop@1", "message_delta", "message_stop"}
	if !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

// recordingChat records the chat request it passes on to h.
type recordingChat struct {
	h     http.Handler
	last  runnerapi.Message // the request's final message
	roles []string          // its messages' roles
}

func (c *recordingChat) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ Messages []runnerapi.Message }
	b, _ := io.ReadAll(r.Body)
	if json.Unmarshal(b, &req) == nil && len(req.Messages) > 0 {
		c.last = req.Messages[len(req.Messages)-1]
	}
	for _, m := range req.Messages {
		c.roles = append(c.roles, m.Role)
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	c.h.ServeHTTP(w, r)
}

// TestResumeResponsesReasoning: a Responses stream resumed inside its open reasoning
// item goes on in that item (its id, output index 0, the sequence numbers after the
// client's), closes it with the whole reasoning and opens its message item after it
// under the next item number; one resumed in its message item after a closed
// reasoning item goes on in the message at output index 1. The reasoning the gateway
// sends as a reasoning item before the final assistant message reaches the chat as
// that message's reasoning_content, and the response's output has both items whole.
func TestResumeResponsesReasoning(t *testing.T) {
	for _, tc := range []struct {
		name, resume, text string
		chat               http.Handler
		want               []string // kind@output_index:item
		reasoning, message string   // the response's items' text
	}{
		{name: "inside the reasoning", resume: `{"id":"resp_old","created_at":7,"seq":6,"reasoning":"rs_old_1","reasoning_open":true}`,
			chat: thinkingChat{}, reasoning: "Let me think more", message: "Done",
			want: []string{"response.reasoning_text.delta@0:rs_old_1", "response.reasoning_text.done@0:rs_old_1",
				"response.content_part.done@0:rs_old_1", "response.output_item.done@0:rs_old_1",
				"response.output_item.added@1:msg_old_2", "response.content_part.added@1:msg_old_2",
				"response.output_text.delta@1:msg_old_2", "response.output_text.done@1:msg_old_2",
				"response.content_part.done@1:msg_old_2", "response.output_item.done@1:msg_old_2", "response.completed"}},
		{name: "in the message after it", resume: `{"id":"resp_old","created_at":7,"seq":6,"reasoning":"rs_old_1","item":"msg_old_2"}`,
			text: "One", chat: &countedChat{}, reasoning: "Let me think", message: "One world",
			want: []string{"response.output_text.delta@1:msg_old_2", "response.output_text.done@1:msg_old_2",
				"response.content_part.done@1:msg_old_2", "response.output_item.done@1:msg_old_2", "response.completed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := &recordingChat{h: tc.chat}
			body := resumed(t, Responses(rc), "/v1/responses", `{"model":"m","stream":true,"input":[{"role":"user","content":"hi"},`+
				`{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"Let me think"}]},`+
				`{"role":"assistant","content":"`+tc.text+`"}]}`, tc.resume)
			if rc.last.Role != "assistant" || rc.last.ReasoningContent != "Let me think" || string(rc.last.Content) != tc.text {
				t.Errorf("the chat's final message %+v, want the assistant's with its reasoning", rc.last)
			}
			events := readEvents(t, strings.NewReader(body))
			var got []string
			for i, e := range events {
				kind := e.event
				if idx, ok := e.data["output_index"]; ok {
					id, _ := e.data["item_id"].(string)
					if item, ok := e.data["item"].(map[string]any); ok {
						id, _ = item["id"].(string)
					}
					kind = fmt.Sprintf("%s@%v:%s", kind, idx, id)
				}
				got = append(got, kind)
				if e.data["sequence_number"] != float64(6+i) {
					t.Errorf("event %d (%s): sequence number %v, want %d", i, kind, e.data["sequence_number"], 6+i)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("events %v, want %v", got, tc.want)
			}
			if e := events[1]; tc.name == "inside the reasoning" && e.data["text"] != tc.reasoning {
				t.Errorf("reasoning_text.done text %q, want %q", e.data["text"], tc.reasoning)
			}
			out := events[len(events)-1].data["response"].(map[string]any)["output"].([]any)
			if len(out) != 2 {
				t.Fatalf("output %v, want the reasoning and the message", out)
			}
			rs, msg := out[0].(map[string]any), out[1].(map[string]any)
			if rs["id"] != "rs_old_1" || rs["content"].([]any)[0].(map[string]any)["text"] != tc.reasoning ||
				msg["id"] != "msg_old_2" || msg["content"].([]any)[0].(map[string]any)["text"] != tc.message {
				t.Errorf("output %v, want rs_old_1 %q and msg_old_2 %q", out, tc.reasoning, tc.message)
			}
		})
	}
}

// TestResumeMessagesOpenTurn: a Messages stream resumed before its first text keeps
// the empty final assistant message the gateway sends (the translation drops empty
// turns otherwise), so the runner continues a new turn; after the client's own start
// of the answer that start stays a closed turn before it, as the first replica
// rendered it, and the continuation's text goes on in the client's text block.
func TestResumeMessagesOpenTurn(t *testing.T) {
	for _, tc := range []struct {
		name, msgs string
		roles      []string
		text       string
	}{
		{"nothing before", `{"role":"user","content":"hi"},{"role":"assistant","content":""}`, []string{"user", "assistant"}, ""},
		{"the client's start of the answer", `{"role":"user","content":"hi"},{"role":"assistant","content":"Sure:"},{"role":"assistant","content":""}`,
			[]string{"user", "assistant", "assistant"}, ""},
		{"text sent after it", `{"role":"user","content":"hi"},{"role":"assistant","content":"Sure:"},{"role":"assistant","content":"Hello"}`,
			[]string{"user", "assistant", "assistant"}, "Hello"},
	} {
		rc := &recordingChat{h: &countedChat{}}
		body := resumed(t, Anthropic(rc), "/v1/messages", `{"model":"m","max_tokens":9,"stream":true,"messages":[`+tc.msgs+`]}`,
			`{"index":0,"open":true}`)
		if !slices.Equal(rc.roles, tc.roles) || string(rc.last.Content) != tc.text {
			t.Errorf("%s: the chat's messages %v ending %q, want %v ending %q", tc.name, rc.roles, rc.last.Content, tc.roles, tc.text)
		}
		var kinds []string
		for _, e := range readEvents(t, strings.NewReader(body)) {
			kinds = append(kinds, e.event)
		}
		if got, want := strings.Join(kinds, " "), "content_block_delta content_block_stop message_delta message_stop"; got != want {
			t.Errorf("%s: events %s, want %s", tc.name, got, want)
		}
	}
}

package translate

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// fakeChat is a chat completions handler with a canned answer: whole (non-stream)
// or the chunks of a stream; it records the request it got. release, when set, is
// waited for after the first chunk.
type fakeChat struct {
	got     map[string]any
	header  http.Header
	whole   runnerapi.ChatCompletion
	chunks  []string
	status  int
	errBody string
	release chan struct{}
}

func (f *fakeChat) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &f.got)
	f.header = r.Header.Clone()
	if f.status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		_, _ = io.WriteString(w, f.errBody)
		return
	}
	if f.got["stream"] != true {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(f.whole)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for i, c := range f.chunks {
		_, _ = io.WriteString(w, "data: "+c+"\n\n")
		_ = rc.Flush()
		if i == 0 && f.release != nil {
			<-f.release
		}
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

func str(s string) *string { return &s }

// toolStream is a chat stream: reasoning, text, then a call whose arguments come in
// two pieces, then the finish and the usage.
var toolStream = []string{
	`{"id":"chatcmpl-abc","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
	`{"id":"chatcmpl-abc","model":"m","choices":[{"index":0,"delta":{"reasoning_content":"Think."}}]}`,
	`{"id":"chatcmpl-abc","model":"m","choices":[{"index":0,"delta":{"content":"Let me check."}}]}`,
	`{"id":"chatcmpl-abc","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`,
	`{"id":"chatcmpl-abc","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
	`{"id":"chatcmpl-abc","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}`,
	`{"id":"chatcmpl-abc","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
	`{"id":"chatcmpl-abc","model":"m","choices":[],"usage":{"prompt_tokens":42,"completion_tokens":9,"total_tokens":51}}`,
}

var toolWhole = runnerapi.ChatCompletion{ID: "chatcmpl-abc", Object: "chat.completion", Model: "m",
	Choices: []runnerapi.ChatChoice{{Message: runnerapi.ChatMessageOut{Role: "assistant", Content: str("Let me check."), ReasoningContent: "Think.",
		ToolCalls: []runnerapi.ToolCall{{ID: "call_1", Type: "function", Function: runnerapi.FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris"}`}}}},
		FinishReason: "tool_calls"}},
	Usage: &runnerapi.Usage{PromptTokens: 42, CompletionTokens: 9, TotalTokens: 51}}

type sseEvent struct {
	event string
	data  map[string]any
}

func readEvents(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(r)
	var cur sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.data); err != nil {
				t.Fatalf("event data %q: %v", line, err)
			}
		case line == "":
			if cur.event != "" {
				out = append(out, cur)
			}
			cur = sseEvent{}
		}
	}
	return out
}

func post(t *testing.T, h http.Handler, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	return w
}

func TestAnthropicRequest(t *testing.T) {
	f := &fakeChat{whole: toolWhole}
	h := Anthropic(f)
	w := post(t, h, "/v1/messages", `{"model":"m","max_tokens":50,"system":[{"type":"text","text":"Be brief."}],
		"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true},
		"thinking":{"type":"enabled","budget_tokens":1024},"stop_sequences":["END"],"metadata":{"user_id":"u1"},
		"messages":[{"role":"user","content":"Weather?"},
		{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"21 C"}]},{"type":"text","text":"And tomorrow?"}]}]}`)
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	got, _ := json.Marshal(f.got)
	for _, want := range []string{`{"content":"Be brief.","role":"system"}`, `"tool_choice":"required"`, `"parallel_tool_calls":false`,
		`"chat_template_kwargs":{"enable_thinking":true}`, `"stop":["END"]`, `"user":"u1"`, `"max_tokens":50`,
		`"tool_calls":[{"function":{"arguments":"{\"city\":\"Paris\"}","name":"get_weather"},"id":"toolu_1","type":"function"}]`,
		`"reasoning_content":"hm"`, `{"content":"21 C","role":"tool","tool_call_id":"toolu_1"}`, `{"content":"And tomorrow?","role":"user"}`,
		`"parameters":{"type":"object"}`} {
		if !strings.Contains(string(got), want) {
			t.Errorf("the chat request lacks %s:\n%s", want, got)
		}
	}
	var msg map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &msg)
	content, _ := json.Marshal(msg["content"])
	if msg["type"] != "message" || msg["stop_reason"] != "tool_use" || !strings.HasPrefix(msg["id"].(string), "msg_") ||
		string(content) != `[{"signature":"","thinking":"Think.","type":"thinking"},{"text":"Let me check.","type":"text"},{"id":"toolu_1","input":{"city":"Paris"},"name":"get_weather","type":"tool_use"}]` {
		t.Errorf("message %s", w.Body)
	}
	if u := msg["usage"].(map[string]any); u["input_tokens"] != 42.0 || u["output_tokens"] != 9.0 {
		t.Errorf("usage %v", u)
	}
}

func TestAnthropicErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
		status           int
		chat             *fakeChat
	}{
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens", 400, nil},
		{"unknown field", `{"model":"m","max_tokens":5,"messages":[],"frobnicate":1}`, "frobnicate", 400, nil},
		{"image", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, "", 400, nil},
		{"bad role", `{"model":"m","max_tokens":5,"messages":[{"role":"tool","content":"x"}]}`, "role", 400, nil},
		{"chat error", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, "no such model", 404,
			&fakeChat{status: 404, errBody: `{"error":{"message":"no such model","type":"invalid_request_error","code":"model_not_found","param":"model"}}`}},
		{"overloaded", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, "busy", 503,
			&fakeChat{status: 503, errBody: `{"error":{"message":"busy","type":"server_error"}}`}},
	} {
		f := tc.chat
		if f == nil {
			f = &fakeChat{whole: toolWhole}
		}
		w := post(t, Anthropic(f), "/v1/messages", tc.body)
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		wantType := anthropicErrorType(tc.status)
		if w.Code != tc.status || e.Type != "error" || e.Error.Type != wantType || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: %d %s, want %d %s naming %q", tc.name, w.Code, w.Body, tc.status, wantType, tc.want)
		}
	}
}

// TestAnthropicStream: the chat stream becomes Anthropic's events, one block at a
// time, and the first event leaves before the model has finished.
func TestAnthropicStream(t *testing.T) {
	f := &fakeChat{chunks: toolStream, release: make(chan struct{})}
	srv := httptest.NewServer(Anthropic(f))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/messages", "application/json",
		strings.NewReader(`{"model":"m","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "event: message_start\n" {
		t.Fatalf("first line %q, %v", first, err)
	}
	close(f.release) // only now does the model go on
	if f.got["stream_options"] == nil {
		t.Error("the chat request does not ask for usage")
	}
	events := readEvents(t, io.MultiReader(strings.NewReader(first), br))
	var kinds []string
	for _, e := range events {
		k := e.event
		switch e.event {
		case "content_block_start":
			k += ":" + e.data["content_block"].(map[string]any)["type"].(string)
		case "content_block_delta":
			k += ":" + e.data["delta"].(map[string]any)["type"].(string)
		}
		kinds = append(kinds, k)
	}
	want := "message_start content_block_start:thinking content_block_delta:thinking_delta content_block_stop " +
		"content_block_start:text content_block_delta:text_delta content_block_stop content_block_start:tool_use " +
		"content_block_delta:input_json_delta content_block_delta:input_json_delta content_block_stop message_delta message_stop"
	if strings.Join(kinds, " ") != want {
		t.Fatalf("events\n%s\nwant\n%s", strings.Join(kinds, " "), want)
	}
	md := events[len(events)-2].data
	if md["delta"].(map[string]any)["stop_reason"] != "tool_use" || md["usage"].(map[string]any)["output_tokens"] != 9.0 {
		t.Errorf("message_delta %v", md)
	}
	if idx := events[7].data["index"]; idx != 2.0 {
		t.Errorf("the tool_use block has index %v, want 2", idx)
	}
}

func TestResponsesRequest(t *testing.T) {
	f := &fakeChat{whole: toolWhole}
	w := post(t, Responses(f), "/v1/responses", `{"model":"m","instructions":"Be brief.","max_output_tokens":30,"seed":4,
		"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"},"strict":true}],"tool_choice":{"type":"function","name":"get_weather"},
		"text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object"},"strict":true}},"reasoning":{"effort":"low"},
		"input":[{"role":"user","content":[{"type":"input_text","text":"Weather?"}]},
		{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{}"},
		{"type":"function_call_output","call_id":"call_1","output":"21 C"}]}`)
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	got, _ := json.Marshal(f.got)
	for _, want := range []string{`{"content":"Be brief.","role":"system"}`, `"max_completion_tokens":30`, `"seed":4`,
		`"tool_choice":{"function":{"name":"get_weather"},"type":"function"}`, `"reasoning_effort":"low"`,
		`"response_format":{"json_schema":{"description":"","name":"w","schema":{"type":"object"},"strict":true},"type":"json_schema"}`,
		`{"content":"","role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"get_weather"},"id":"call_1","type":"function"}]}`,
		`{"content":"21 C","role":"tool","tool_call_id":"call_1"}`, `"strict":true`} {
		if !strings.Contains(string(got), want) {
			t.Errorf("the chat request lacks %s:\n%s", want, got)
		}
	}
	for _, tc := range []struct{ body, param string }{
		{`{"model":"m","input":"x","previous_response_id":"resp_1"}`, "previous_response_id"},
		{`{"model":"m","input":"x","tools":[{"type":"local_shell"}]}`, "tools[0].type"},
		{`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, "input[0].content[0].image_url"},
		{`{"model":"m","input":"x","frobnicate":1}`, "frobnicate"},
		{`{"model":"m"}`, "input"},
	} {
		w := post(t, Responses(f), "/v1/responses", tc.body)
		var e struct{ Error struct{ Param *string } }
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != tc.param {
			t.Errorf("%s: %d %s, want a 400 naming %s", tc.body, w.Code, w.Body, tc.param)
		}
	}
}

// TestResponsesWithTheOfficialClient: the official OpenAI Go client reads the
// translated response and stream.
func TestResponsesWithTheOfficialClient(t *testing.T) {
	f := &fakeChat{whole: toolWhole, chunks: toolStream}
	srv := httptest.NewServer(Responses(f))
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	ctx := context.Background()
	params := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Weather?")}}
	r, err := c.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != "completed" || r.OutputText() != "Let me check." || len(r.Output) != 3 || r.Usage.InputTokens != 42 {
		t.Fatalf("response %+v", r)
	}
	if call := r.Output[2].AsFunctionCall(); call.CallID != "call_1" || call.Name != "get_weather" || call.Arguments != `{"city":"Paris"}` {
		t.Errorf("function call %+v", call)
	}
	stream := c.Responses.NewStreaming(ctx, params)
	var types []string
	var final responses.Response
	var text, args strings.Builder
	seq := int64(-1)
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != seq+1 {
			t.Errorf("%s: sequence number %d after %d", ev.Type, ev.SequenceNumber, seq)
		}
		seq = ev.SequenceNumber
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.function_call_arguments.delta":
			args.WriteString(ev.Delta)
		case "response.completed":
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added response.reasoning_text.delta " +
		"response.reasoning_text.done response.content_part.done response.output_item.done response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.done response.content_part.done response.output_item.done " +
		"response.output_item.added response.function_call_arguments.delta response.function_call_arguments.delta " +
		"response.function_call_arguments.done response.output_item.done response.completed"
	if strings.Join(types, " ") != want {
		t.Errorf("events\n%s\nwant\n%s", strings.Join(types, " "), want)
	}
	if text.String() != "Let me check." || args.String() != `{"city":"Paris"}` || final.OutputText() != "Let me check." ||
		final.Usage.OutputTokens != 9 || len(final.Output) != 3 {
		t.Errorf("streamed text %q args %q, final %+v", text.String(), args.String(), final)
	}
}

func TestAnthropicStopReason(t *testing.T) {
	for _, tc := range []struct {
		finish, stopSeq string
		reason          string
		seq             any
	}{
		{"stop", "", "end_turn", nil},
		{"stop", "END", "stop_sequence", "END"},
		{"length", "", "max_tokens", nil},
		{"tool_calls", "", "tool_use", nil},
		{"tool_calls", "END", "tool_use", nil}, // the calls are what the client must act on
	} {
		reason, seq := stopReason(tc.finish, tc.stopSeq)
		if reason != tc.reason || seq != tc.seq {
			t.Errorf("stopReason(%q, %q) = %q, %v; want %q, %v", tc.finish, tc.stopSeq, reason, seq, tc.reason, tc.seq)
		}
	}
}

func TestResponsesToolChoiceOfResponses(t *testing.T) {
	for body, want := range map[string]int{
		`{"model":"m","input":"x","tool_choice":"required"}`:                        http.StatusOK,
		`{"model":"m","input":"x","tool_choice":{"type":"function","name":"f"}}`:    http.StatusOK,
		`{"model":"m","input":"x","tool_choice":""}`:                                http.StatusBadRequest,
		`{"model":"m","input":"x","tool_choice":"any"}`:                             http.StatusBadRequest,
		`{"model":"m","input":"x","tool_choice":{"type":"function","function":{}}}`: http.StatusBadRequest,
	} {
		f := &fakeChat{whole: toolWhole}
		w := post(t, Responses(f), "/v1/responses", body)
		if w.Code != want {
			t.Errorf("%s: %d %s, want %d", body, w.Code, w.Body, want)
			continue
		}
		if want != http.StatusOK && (f.got != nil || !strings.Contains(w.Body.String(), `{\"type\":\"function\",\"name\":...}`)) {
			t.Errorf("%s: forwarded %v, answered %s; want the Responses form of tool_choice in the error", body, f.got, w.Body)
		}
	}
}

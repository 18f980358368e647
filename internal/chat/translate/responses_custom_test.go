package translate

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/lark"
)

// editGrammar is a Lark grammar of the shape of a coding agent's patch tool, written
// for these tests.
const editGrammar = `start: "*** Begin Patch" LF change+ "*** End Patch" LF?
change: "*** Update File: " PATH LF line+
line: ("+" | "-" | " ") /[^\n]*/ LF
PATH: /[^\n]+/
%import common.LF
`

const editInput = "*** Begin Patch\n*** Update File: a.go\n-x := \"old\"\n+x := \"new\\tvalue\"\n*** End Patch\n"

func customToolJSON(def string) string {
	b, _ := json.Marshal(map[string]any{"type": "custom", "name": "apply_patch", "description": "Edit files.",
		"format": map[string]any{"type": "grammar", "syntax": "lark", "definition": def}})
	return string(b)
}

// TestResponsesCustomToolRequest: a custom tool is a function of one string, "input",
// whose grammar goes to the runner; tool_choice names it; its call and output in the
// input are the function's call and result.
func TestResponsesCustomToolRequest(t *testing.T) {
	f := &fakeChat{whole: toolWhole}
	in, _ := json.Marshal(editInput)
	w := post(t, Responses(f), "/v1/responses", `{"model":"m","tools":[`+customToolJSON(editGrammar)+`,
		{"type":"custom","name":"note","format":{"type":"text"}}],
		"tool_choice":{"type":"custom","name":"apply_patch"},
		"input":[{"role":"user","content":"Fix a.go"},
		{"type":"custom_tool_call","id":"ctc_1","call_id":"call_1","name":"apply_patch","input":`+string(in)+`},
		{"type":"custom_tool_call_output","call_id":"call_1","output":"Done!"}]}`)
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	var got struct {
		Tools      []runnerapi.Tool    `json:"tools"`
		ToolChoice json.RawMessage     `json:"tool_choice"`
		Messages   []runnerapi.Message `json:"messages"`
	}
	b, _ := json.Marshal(f.got)
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Tools) != 2 {
		t.Fatalf("tools %+v", got.Tools)
	}
	patch, note := got.Tools[0].Function, got.Tools[1].Function
	if patch.Name != "apply_patch" || patch.InputGrammar == nil || patch.InputGrammar.Syntax != "lark" ||
		patch.InputGrammar.Definition != editGrammar || !strings.Contains(string(patch.Parameters), `"input":{"description":`) {
		t.Errorf("apply_patch as the model sees it: %+v", patch)
	}
	if note.InputGrammar != nil || !strings.Contains(string(note.Parameters), `"required":["input"]`) {
		t.Errorf("a text-format tool as the model sees it: %+v", note)
	}
	if string(got.ToolChoice) != `{"function":{"name":"apply_patch"},"type":"function"}` {
		t.Errorf("tool_choice %s", got.ToolChoice)
	}
	call, out := got.Messages[1], got.Messages[2]
	if len(call.ToolCalls) != 1 || call.ToolCalls[0].Function.Name != "apply_patch" ||
		customInput(call.ToolCalls[0].Function.Arguments) != editInput || out.Role != "tool" || out.ToolCallID != "call_1" || out.Content != "Done!" {
		t.Errorf("the call and its output as messages: %+v %+v", call, out)
	}
}

// customWhole is a chat answer that calls apply_patch with editInput.
var customWhole = runnerapi.ChatCompletion{ID: "chatcmpl-ct", Object: "chat.completion", Model: "m",
	Choices: []runnerapi.ChatChoice{{Message: runnerapi.ChatMessageOut{Role: "assistant",
		ToolCalls: []runnerapi.ToolCall{{ID: "call_7", Type: "function", Function: runnerapi.FunctionCall{Name: "apply_patch",
			Arguments: customArguments(editInput)}}}}, FinishReason: "tool_calls"}},
	Usage: &runnerapi.Usage{PromptTokens: 40, CompletionTokens: 30, TotalTokens: 70}}

// customStream streams the same call, its arguments cut inside escapes and a
// multi-byte character.
func customStream(t *testing.T) []string {
	args := customArguments(editInput + "é")
	cuts := []int{3, strings.Index(args, `\n`) + 1, strings.Index(args, `\"`) + 1, strings.Index(args, `\t`) + 1, len(args) - 4}
	chunks := []string{`{"id":"chatcmpl-ct","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"id":"chatcmpl-ct","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_7","type":"function","function":{"name":"apply_patch","arguments":""}}]}}]}`}
	from := 0
	for _, c := range append(cuts, len(args)) {
		part, _ := json.Marshal(args[from:c])
		if !json.Valid(part) {
			t.Fatalf("cut %d", c)
		}
		chunks = append(chunks, `{"id":"chatcmpl-ct","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":`+string(part)+`}}]}}]}`)
		from = c
	}
	return append(chunks, `{"id":"chatcmpl-ct","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`)
}

// TestResponsesCustomToolCallWithTheOfficialClient: the official client reads a custom
// tool's call whole and streamed; the streamed deltas add up to the input.
func TestResponsesCustomToolCallWithTheOfficialClient(t *testing.T) {
	f := &fakeChat{whole: customWhole, chunks: customStream(t)}
	srv := httptest.NewServer(Responses(f))
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	ctx := context.Background()
	params := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Fix a.go")},
		Tools: []responses.ToolUnionParam{{OfCustom: &responses.CustomToolParam{Name: "apply_patch",
			Format: responses.CustomToolInputFormatUnionParam{OfGrammar: &responses.CustomToolInputFormatGrammarParam{Definition: editGrammar, Syntax: "lark"}}}}},
		ToolChoice: responses.ResponseNewParamsToolChoiceUnion{OfCustomTool: &responses.ToolChoiceCustomParam{Name: "apply_patch"}}}
	r, err := c.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Output) != 1 || r.Output[0].Type != "custom_tool_call" {
		t.Fatalf("output %+v", r.Output)
	}
	if call := r.Output[0].AsCustomToolCall(); call.CallID != "call_7" || call.Name != "apply_patch" || call.Input != editInput {
		t.Errorf("custom tool call %+v", call)
	}
	stream := c.Responses.NewStreaming(ctx, params)
	var types []string
	var deltas strings.Builder
	var done string
	var final responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.custom_tool_call_input.delta":
			deltas.WriteString(ev.Delta)
		case "response.custom_tool_call_input.done":
			done = ev.Input
		case "response.completed":
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	want := editInput + "é"
	if deltas.String() != want || done != want || len(final.Output) != 1 || final.Output[0].AsCustomToolCall().Input != want {
		t.Errorf("streamed deltas %q, done %q, final %+v; want %q", deltas.String(), done, final.Output, want)
	}
	if n := strings.Count(strings.Join(types, " "), "response.custom_tool_call_input.delta"); n < 3 {
		t.Errorf("%d input deltas in %v", n, types)
	}
	g, err := lark.Parse("lark", editGrammar)
	if err != nil || !g.Match(editInput) {
		t.Errorf("the test's input does not match its grammar (%v)", err)
	}
}

func TestCustomInputSoFar(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{``, ``},
		{`{"inp`, ``},
		{`{"input": `, ``},
		{`{"input": "ab`, `ab`},
		{`{"input": "a\`, `a`},
		{`{"input": "a\n`, "a\n"},
		{`{"input": "a\u00`, `a`},
		{`{"input": "a\u00e9`, `aé`},
		{`{"input": "a\ud83d`, `a`},
		{`{"input": "a\ud83d\ude00`, `a😀`},
		{`{"input": "a` + "\xc3", `a`},
		{`{"input": "a\"b"}`, `a"b`},
		{`{"input":"x"}`, `x`},
	} {
		if got := customInputSoFar(tc.args); got != tc.want {
			t.Errorf("customInputSoFar(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
	if customInput(`not json`) != `not json` || customInput(customArguments("x\n")) != "x\n" {
		t.Error("customInput")
	}
}

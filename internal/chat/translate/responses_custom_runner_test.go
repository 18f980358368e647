package translate

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/lark"
	"github.com/macfleet/macfleet/test/support/listening"
)

// boundedPatchGrammar has the shape of a coding agent's patch tool (written for this
// test), with bounded lines so that even a tiny model's call ends.
const boundedPatchGrammar = `start: begin change end
begin: "*** Begin Patch" LF
end: "*** End Patch" LF
change: "*** Update File: " PATH LF line ~ 1..3
line: ("+" | "-" | " ") TEXT LF
PATH: /[a-z]{1,12}\.go/
TEXT: /[^\n]{0,24}/
%import common.LF
`

// startRunner serves model with the runner binary $MACFLEET_RUNNER (skipping the test
// without one) and returns its address once it is ready.
func startRunner(t *testing.T, model string) *url.URL {
	t.Helper()
	bin := os.Getenv("MACFLEET_RUNNER")
	if bin == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner (make runner) and export MACFLEET_RUNNER=bin/macfleet-runner")
	}
	p := listening.Start(t, "runner", exec.Command(bin, "--model", model, "--threads", "1", "--addr", "127.0.0.1:0"))
	base := &url.URL{Scheme: "http", Host: p.Addr}
	for deadline := time.Now().Add(2 * time.Minute); ; {
		var h runnerapi.Health
		if res, err := http.Get(base.String() + "/health"); err == nil {
			_ = json.NewDecoder(res.Body).Decode(&h)
			res.Body.Close()
		}
		if h.Status == runnerapi.StateReady {
			return base
		}
		if h.Status == runnerapi.StateFailed || time.Now().After(deadline) {
			t.Fatalf("the runner is not ready: %+v", h)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCustomToolOnARealRunner: the trained test model, served by a real runner behind
// the Responses translator, is asked through the official client to call a custom
// tool with a Lark grammar of a patch's shape; the call comes back as a
// custom_tool_call whose input the grammar matches (the runner loaded the translated
// grammar and held the model to it), streamed in deltas that add up to it; the next
// turn, with the call and its output, is accepted and its prompt holds the output.
func TestCustomToolOnARealRunner(t *testing.T) {
	base := startRunner(t, filepath.Join("..", "..", "..", "test", "models", "tiny-chat-trained.gguf"))
	ts := httptest.NewServer(Responses(httputil.NewSingleHostReverseProxy(base)))
	defer ts.Close()
	srv := ts.URL
	c := openai.NewClient(option.WithBaseURL(srv+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tool := responses.ToolUnionParam{OfCustom: &responses.CustomToolParam{Name: "apply_patch", Description: openai.String("Edit a file with a patch."),
		Format: responses.CustomToolInputFormatUnionParam{OfGrammar: &responses.CustomToolInputFormatGrammarParam{
			Definition: boundedPatchGrammar, Syntax: "lark"}}}}
	user := responses.ResponseInputItemParamOfMessage("Rename the variable x to y in main.go.", responses.EasyInputMessageRoleUser)
	params := responses.ResponseNewParams{Model: "m", Temperature: openai.Float(0), MaxOutputTokens: openai.Int(400),
		ParallelToolCalls: openai.Bool(false), // as Codex sends it
		Input:             responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{user}},
		Tools:             []responses.ToolUnionParam{tool},
		ToolChoice:        responses.ResponseNewParamsToolChoiceUnion{OfCustomTool: &responses.ToolChoiceCustomParam{Name: "apply_patch"}}}

	stream := c.Responses.NewStreaming(ctx, params)
	var deltas strings.Builder
	var final responses.Response
	for stream.Next() {
		switch ev := stream.Current(); ev.Type {
		case "response.custom_tool_call_input.delta":
			deltas.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if final.Status != "completed" || len(final.Output) != 1 || final.Output[0].Type != "custom_tool_call" {
		t.Fatalf("response %s: %+v", final.Status, final.Output)
	}
	call := final.Output[0].AsCustomToolCall()
	g, err := lark.Parse("lark", boundedPatchGrammar)
	if err != nil {
		t.Fatal(err)
	}
	if call.Name != "apply_patch" || call.CallID == "" || !g.Match(call.Input) || deltas.String() != call.Input {
		t.Fatalf("call %s %q (input %q, streamed %q): the input must match the grammar and the deltas add up to it",
			call.Name, call.CallID, call.Input, deltas.String())
	}
	t.Logf("input:\n%s", call.Input)

	const output = "Patched main.go: 1 file changed, 1 insertion, 1 deletion"
	params.Input.OfInputItemList = responses.ResponseInputParam{user,
		responses.ResponseInputItemParamOfCustomToolCall(call.CallID, call.Input, call.Name),
		responses.ResponseInputItemParamOfCustomToolCallOutput(call.CallID, output)}
	params.ToolChoice = responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsAuto)}
	params.MaxOutputTokens = openai.Int(8)
	next, err := c.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	// The second prompt holds the first (the user's message), the call and its output.
	if next.Usage.InputTokens <= final.Usage.InputTokens+int64(len(strings.Fields(output))) {
		t.Errorf("the next turn's prompt is %d tokens, the first's %d: the call and its output are missing",
			next.Usage.InputTokens, final.Usage.InputTokens)
	}
}

// TestCustomToolGrammarsLoadInTheRunner: grammars of every construct the translator
// accepts load in llama.cpp's grammar parser (a forced call under each is answered, not
// refused), and what the model writes under them in a few tokens is a prefix the
// grammar allows (a whole call where it finished).
func TestCustomToolGrammarsLoadInTheRunner(t *testing.T) {
	base := startRunner(t, filepath.Join("..", "..", "..", "test", "models", "tiny-chat-trained.gguf"))
	ts := httptest.NewServer(Responses(httputil.NewSingleHostReverseProxy(base)))
	defer ts.Close()
	for _, g := range []struct{ syntax, def string }{
		{"lark", editGrammar},
		{"lark", "start: \"say \\\"\" /[^\\n\"\\\\]{1,8}/i \"\\\"\" (\"!\" | \"?\")? LF\n%import common.LF"},
		{"lark", "start: WORD (\",\" WS_INLINE? WORD) ~ 0..3 [\".\"]\n%import common (WORD, WS_INLINE)"},
		{"lark", "start: \"a\"..\"f\" ~ 1..3 \"\\t\" \"é😀\" /[\\x01-\\x1f]/ \"\\\"\" /[a-z\\\\]{0,3}/ \"\\\"\""},
		{"lark", "start: ESCAPED_STRING\n%import common.ESCAPED_STRING"},
		{"regex", `^[0-9]{3}-(?i:[a-z]{2,4})\.go$`},
		{"regex", `\w+\s\d*|.{1,5}`},
	} {
		body, _ := json.Marshal(map[string]any{"model": "m", "input": "Go.", "max_output_tokens": 64, "temperature": 0,
			"tools": []any{map[string]any{"type": "custom", "name": "t", "format": map[string]any{"type": "grammar",
				"syntax": g.syntax, "definition": g.def}}},
			"tool_choice": map[string]any{"type": "custom", "name": "t"}})
		res, err := http.Post(ts.URL+"/v1/responses", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Status string
			Output []struct{ Type, Input string }
			Error  *struct{ Message string }
		}
		_ = json.NewDecoder(res.Body).Decode(&r)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || r.Error != nil {
			t.Errorf("%s: %d %+v", g.def, res.StatusCode, r.Error)
			continue
		}
		parsed, err := lark.Parse(g.syntax, g.def)
		if err != nil {
			t.Fatal(err)
		}
		for _, item := range r.Output { // one call or, parallel calls being allowed, several
			if r.Status == "completed" && (item.Type != "custom_tool_call" || !parsed.Match(item.Input)) {
				t.Errorf("%s: a completed call %+v that the grammar does not match", g.def, item)
			}
		}
		t.Logf("%s: %s %+v", g.syntax, r.Status, r.Output)
	}
}

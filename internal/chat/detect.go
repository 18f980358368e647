package chat

import (
	"encoding/json"
	"regexp"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// The probe: a conversation whose assistant turn calls probeFunction. What a chat
// template renders for that turn is the syntax it taught its model to write calls in,
// a better signal than which marks its source mentions (Qwen3-Coder's and GLM's
// templates both mention <tool_call>, and so do their instructions for other formats).
const (
	probeFunction = "mf_probe_function"
	probeCallID   = "mfprobe01" // nine alphanumerics: Mistral templates insist
)

// ProbeInput is the probe conversation: a question, a call of probeFunction with one
// string argument, its result, with probeFunction offered as a tool.
func ProbeInput() Input {
	return Input{
		Messages: []runnerapi.Message{
			{Role: "user", Content: "What does the probe say?"},
			{Role: "assistant", ToolCalls: []runnerapi.ToolCall{{ID: probeCallID, Type: "function",
				Function: runnerapi.FunctionCall{Name: probeFunction, Arguments: `{"query":"probe"}`}}}},
			{Role: "tool", ToolCallID: probeCallID, Name: probeFunction, Content: "ok"},
		},
		Tools: []runnerapi.Tool{{Type: "function", Function: runnerapi.Function{Name: probeFunction,
			Description: "Reads the probe.",
			Parameters:  json.RawMessage(`{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}`)}}},
		AddGenerationPrompt: true,
	}
}

var (
	probeHermes = regexp.MustCompile(`<tool_call>\s*\{\s*"name"\s*:\s*"` + probeFunction + `"`)
	probeGLM    = regexp.MustCompile(`<tool_call>\s*` + probeFunction + `\s*<arg_key>`)
	probeLlama3 = regexp.MustCompile(`(<\|python_tag\|>\s*)?\{\s*"name"\s*:\s*"` + probeFunction + `"\s*,\s*"parameters"`)
)

// FormatOfRendering names the call syntax of a template's rendering of ProbeInput;
// ok is false when the rendering shows no call in a syntax known here.
func FormatOfRendering(out string) (f Format, ok bool) {
	switch {
	case strings.Contains(out, "to=functions."+probeFunction):
		return FormatHarmony, true
	case strings.Contains(out, toolCallOpen) && strings.Contains(out, "<function="+probeFunction+">"):
		return FormatQwen3Coder, true
	case probeGLM.MatchString(out):
		return FormatGLM, true
	case strings.Contains(out, deepseekCallBegin+probeFunction+deepseekSep):
		return FormatDeepSeek, true
	case strings.Contains(out, kimiCallBegin) && strings.Contains(out, kimiArgBegin):
		// Kimi's templates write the call's id, which its model writes as
		// functions.NAME:N, where the name would be.
		return FormatKimi, true
	case strings.Contains(out, gemmaCallBegin+"call:"+probeFunction+"{"):
		return FormatFunctionGemma, true
	case strings.Contains(out, "[TOOL_CALLS]"+probeFunction) || strings.Contains(out, "[TOOL_CALLS][") && strings.Contains(out, probeFunction):
		return FormatMistral, true
	case probeHermes.MatchString(out):
		return FormatHermes, true
	case probeLlama3.MatchString(out):
		return FormatLlama3, true
	}
	return FormatNone, false
}

// probe renders the probe with t and takes the call syntax it shows as t's format.
// A template that cannot render a call whose arguments are an object but can when
// they are a string (one that joins them to strings, as DeepSeek's do) is given
// strings from then on.
func (t *Template) probe() {
	out, e := t.Render(ProbeInput(), false)
	if e != nil {
		t.stringArgs = true
		if out, e = t.Render(ProbeInput(), false); e != nil {
			t.stringArgs = false
			return
		}
	}
	if f, ok := FormatOfRendering(out); ok {
		t.Format = f
	}
}

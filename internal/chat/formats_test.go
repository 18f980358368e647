package chat

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/model/parsers"
	"github.com/ollama/ollama/model/renderers"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// The coding models' formats are tested on their real templates: the renderers of
// the llama.cpp module this repository depends on (github.com/ollama/ollama, read from
// the module cache at test time) write each model's chat template in Go. What such a
// template renders for an assistant turn that called tools is what the model was
// trained to write, so that rendering is the model output fed to the parser.

const formatsQuestion = "What is the weather in Paris for three days, and the time in UTC?"

var formatsTools = []runnerapi.Tool{
	{Type: "function", Function: runnerapi.Function{Name: "get_weather", Description: "The forecast.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},` +
			`"metric":{"type":"boolean"}},"required":["city"]}`)}},
	{Type: "function", Function: runnerapi.Function{Name: "get_time", Description: "The time.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"tz":{"type":"string"}}}`)}},
}

// formatsCalls are the calls of the assistant's turn, arguments typed as the schemas say.
var formatsCalls = []jsonCall{
	{"get_weather", map[string]any{"city": "Paris", "days": 3.0, "metric": true}},
	{"get_time", map[string]any{"tz": "UTC"}},
}

type jsonCall struct {
	Name string
	Args map[string]any
}

// moduleInput is in as the module's renderers take it.
func moduleInput(t *testing.T, in Input) ([]api.Message, []api.Tool) {
	t.Helper()
	var msgs []api.Message
	for _, m := range in.Messages {
		am := api.Message{Role: m.Role, Content: string(m.Content), ToolCallID: m.ToolCallID, ToolName: m.Name}
		for _, c := range m.ToolCalls {
			var args api.ToolCallFunctionArguments
			if err := json.Unmarshal([]byte(c.Function.Arguments), &args); err != nil {
				t.Fatal(err)
			}
			am.ToolCalls = append(am.ToolCalls, api.ToolCall{ID: c.ID, Function: api.ToolCallFunction{Name: c.Function.Name, Arguments: args}})
		}
		msgs = append(msgs, am)
	}
	tools := moduleTools(in.Tools)
	if len(tools) != len(in.Tools) {
		t.Fatalf("the module reads %d of %d tools", len(tools), len(in.Tools))
	}
	return msgs, tools
}

// formatsConversation: the question, then the assistant's turn that says a sentence
// and calls both tools.
func formatsConversation() Input {
	var calls []runnerapi.ToolCall
	for i, c := range formatsCalls {
		b, _ := json.Marshal(c.Args)
		calls = append(calls, runnerapi.ToolCall{ID: []string{"call00001", "call00002"}[i], Type: "function",
			Function: runnerapi.FunctionCall{Name: c.Name, Arguments: string(b)}})
	}
	return Input{Messages: []runnerapi.Message{
		{Role: "user", Content: formatsQuestion},
		{Role: "assistant", Content: "Let me check.", ToolCalls: calls},
	}, Tools: formatsTools}
}

// assistantTurn is the model output in a rendered conversation: from the assistant's
// sentence to the end of its last call region.
func assistantTurn(t *testing.T, prompt string, f Format) string {
	t.Helper()
	q := strings.Index(prompt, formatsQuestion)
	from := strings.Index(prompt[q+1:], "Let me check.")
	if q < 0 || from < 0 {
		t.Fatalf("the rendering lacks the conversation:\n%s", prompt)
	}
	from += q + 1
	_, end := f.region()
	to := strings.LastIndex(prompt, end)
	if to < from {
		t.Fatalf("no %q after the assistant's sentence:\n%s", end, prompt)
	}
	return prompt[from : to+len(end)]
}

// parseOutput runs output through a parser whole, then in random chunkings, and
// checks each gives the same answer; it returns the calls with decoded arguments.
func parseOutput(t *testing.T, o Options, output string) (content string, calls []jsonCall) {
	t.Helper()
	whole := collect(NewParser(o), []string{output})
	rng := rand.New(rand.NewPCG(45, uint64(len(output))))
	for range 40 {
		var chunks []string
		for rest := output; rest != ""; {
			n := min(len(rest), 1+rng.IntN(12))
			chunks, rest = append(chunks, rest[:n]), rest[n:]
		}
		if d := cmp.Diff(whole, collect(NewParser(o), chunks)); d != "" {
			t.Fatalf("streamed in %d chunks differs from whole (-whole +streamed):\n%s", len(chunks), d)
		}
	}
	for _, c := range whole.Calls {
		var args map[string]any
		if err := json.Unmarshal([]byte(c.Args), &args); err != nil {
			t.Fatalf("call %s: arguments %q: %v", c.Name, c.Args, err)
		}
		calls = append(calls, jsonCall{c.Name, args})
	}
	return whole.Content, calls
}

func TestCodingModelFormats(t *testing.T) {
	for _, tc := range []struct {
		name     string
		format   Format
		renderer renderers.Renderer
	}{
		{"qwen3-coder", FormatQwen3Coder, &renderers.Qwen3CoderRenderer{}},
		{"glm-4.6", FormatGLM, &renderers.GLM46Renderer{}},
		{"glm-4.7", FormatGLM, &renderers.GLM47Renderer{}},
		{"deepseek-v3.1", FormatDeepSeek, &renderers.DeepSeek3Renderer{Variant: renderers.Deepseek31}},
		{"function-gemma", FormatFunctionGemma, &renderers.FunctionGemmaRenderer{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Detection: the template's rendering of a call shows its syntax.
			msgs, tools := moduleInput(t, ProbeInput())
			probe, err := tc.renderer.Render(msgs, tools, nil)
			if err != nil {
				t.Fatal(err)
			}
			if f, ok := FormatOfRendering(probe); !ok || f != tc.format {
				t.Errorf("format of the probe's rendering = %v (%v), want %v:\n%s", f, ok, tc.format, probe)
			}

			msgs, tools = moduleInput(t, formatsConversation())
			prompt, err := tc.renderer.Render(msgs, tools, nil)
			if err != nil {
				t.Fatal(err)
			}
			output := assistantTurn(t, prompt, tc.format)
			o := Options{Format: tc.format, Tools: true, Parallel: true, Defs: formatsTools}
			content, calls := parseOutput(t, o, output)
			if strings.TrimSpace(content) != "Let me check." {
				t.Errorf("content = %q, want the sentence alone; output:\n%s", content, output)
			}
			if d := cmp.Diff(formatsCalls, calls); d != "" {
				t.Errorf("calls (-want +got):\n%s\noutput:\n%s", d, output)
			}

			// Parallel calls off: the first call only.
			o.Parallel = false
			if _, calls := parseOutput(t, o, output); len(calls) != 1 || calls[0].Name != "get_weather" {
				t.Errorf("parallel off: calls = %v, want get_weather alone", calls)
			}

			// The limit cut the second call: the first comes back, the cut one does not.
			o.Parallel = true
			cut := output[:strings.LastIndex(output, "UTC")]
			if _, calls := parseOutput(t, o, cut); cmp.Diff(formatsCalls[:1], calls) != "" {
				t.Errorf("cut in the second call: calls = %v, want the first alone; output:\n%s", calls, cut)
			}
		})
	}
}

// TestToolCallTagContents: a <tool_call> region is read by what it holds, so the calls
// of a model whose template is detected by the tag alone (main's detection took the
// Qwen3-Coder and GLM templates for the JSON format) are not lost.
func TestToolCallTagContents(t *testing.T) {
	for _, r := range []renderers.Renderer{&renderers.Qwen3CoderRenderer{}, &renderers.GLM47Renderer{}} {
		msgs, tools := moduleInput(t, formatsConversation())
		prompt, err := r.Render(msgs, tools, nil)
		if err != nil {
			t.Fatal(err)
		}
		output := assistantTurn(t, prompt, FormatHermes)
		_, calls := parseOutput(t, Options{Format: FormatHermes, Tools: true, Parallel: true, Defs: formatsTools}, output)
		if d := cmp.Diff(formatsCalls, calls); d != "" {
			t.Errorf("%T as hermes: calls (-want +got):\n%s", r, d)
		}
	}
}

// TestKimiFormat: Kimi K2's calls, written as its model card shows them (the module
// has no renderer for it).
func TestKimiFormat(t *testing.T) {
	output := "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" +
		`{"city": "Paris", "days": 3, "metric": true}<|tool_call_end|><|tool_call_begin|>functions.get_time:1` +
		`<|tool_call_argument_begin|>{"tz": "UTC"}<|tool_call_end|><|tool_calls_section_end|>`
	o := Options{Format: FormatKimi, Tools: true, Parallel: true}
	content, calls := parseOutput(t, o, output)
	if content != "Let me check." || cmp.Diff(formatsCalls, calls) != "" {
		t.Errorf("content %q, calls %v", content, calls)
	}
	cut := output[:strings.LastIndex(output, "UTC")]
	if _, calls := parseOutput(t, o, cut); cmp.Diff(formatsCalls[:1], calls) != "" {
		t.Errorf("cut: calls = %v, want the first alone", calls)
	}
	// A section that is not calls stays content.
	bad := "<|tool_calls_section_begin|>functions.get_time<|tool_calls_section_end|>"
	if content, calls := parseOutput(t, o, bad); content != bad || len(calls) != 0 {
		t.Errorf("malformed: content %q, calls %v", content, calls)
	}
}

// TestDevstralFormat: [TOOL_CALLS]name[ARGS]{…} per call, as the module's parser for
// that family reads it.
func TestDevstralFormat(t *testing.T) {
	output := `Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3, "metric": true}` +
		`[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}`
	content, calls := parseOutput(t, Options{Format: FormatMistral, Tools: true, Parallel: true}, output)
	if content != "Let me check." || cmp.Diff(formatsCalls, calls) != "" {
		t.Errorf("content %q, calls %v", content, calls)
	}
	// The module's parser agrees.
	p := &parsers.MinistralParser{}
	p.Init(moduleTools(formatsTools), nil, nil)
	mc, _, mcalls, err := p.Add(output, true)
	if err != nil {
		t.Fatal(err)
	}
	var theirs []jsonCall
	for _, c := range mcalls {
		b, _ := json.Marshal(c.Function.Arguments)
		var args map[string]any
		_ = json.Unmarshal(b, &args)
		theirs = append(theirs, jsonCall{c.Function.Name, args})
	}
	if d := cmp.Diff(calls, theirs); d != "" || strings.TrimSpace(mc) != content {
		t.Errorf("the module's parser reads %q and (-ours +theirs):\n%s", mc, d)
	}
}

// TestGemma3Template: the real Gemma 3 template renders no tools, so a request with
// tools is refused by name (the function-calling Gemma 3 has its own format, above).
func TestGemma3Template(t *testing.T) {
	src, err := testassets.Find("gemma3-instruct")
	if err != nil {
		t.Fatal(err)
	}
	tm, err := NewTemplate(src.Source, "<bos>", "<eos>")
	if err != nil {
		t.Fatal(err)
	}
	in := formatsConversation()
	if _, e := tm.Render(in, true); e == nil || e.Param != "tools" {
		t.Fatalf("render with tools: %v, want a 400 naming tools", e)
	}
}

// TestFormatOfRendering: the call syntax is read off what a template rendered for the
// probe, not off the marks its source mentions.
func TestFormatOfRendering(t *testing.T) {
	p := probeFunction
	for _, tc := range []struct {
		name, out string
		want      Format
		ok        bool
	}{
		{"hermes", "<tool_call>\n{\"name\": \"" + p + "\", \"arguments\": {\"query\": \"probe\"}}\n</tool_call>", FormatHermes, true},
		{"qwen3-coder mentions JSON in its instructions", "Reply as <tool_call>{\"name\": ...}</tool_call>.\n" +
			"<tool_call>\n<function=" + p + ">\n<parameter=query>\nprobe\n</parameter>\n</function>\n</tool_call>", FormatQwen3Coder, true},
		{"kimi", "<|tool_calls_section_begin|><|tool_call_begin|>functions." + p + ":0<|tool_call_argument_begin|>{}<|tool_call_end|>", FormatKimi, true},
		{"kimi writing the call's id", "<|tool_call_begin|>" + probeCallID + "<|tool_call_argument_begin|>{}<|tool_call_end|>", FormatKimi, true},
		{"mistral array", "[TOOL_CALLS][{\"name\": \"" + p + "\", \"arguments\": {}}]", FormatMistral, true},
		{"mistral args", "[TOOL_CALLS]" + p + "[ARGS]{}", FormatMistral, true},
		{"harmony", "<|start|>assistant to=functions." + p + "<|channel|>commentary json<|message|>{}<|call|>", FormatHarmony, true},
		{"llama3", "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"" + p + "\", \"parameters\": {}}", FormatLlama3, true},
		{"no call rendered", "<|im_start|>user\nWhat does the probe say?<|im_end|>", FormatNone, false},
	} {
		if f, ok := FormatOfRendering(tc.out); f != tc.want || ok != tc.ok {
			t.Errorf("%s: %v %v, want %v %v", tc.name, f, ok, tc.want, tc.ok)
		}
	}
}

// TestStringArgumentsTemplate: a template that joins a call's arguments to strings,
// as DeepSeek's do, renders a conversation holding calls (it failed on any such
// conversation when arguments were always an object) and is detected by its calls.
func TestStringArgumentsTemplate(t *testing.T) {
	// Written here in the shape of such a template, not copied from one.
	const src = `{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}` +
		`{% elif m.tool_calls %}<｜Assistant｜>{{ m.content }}<｜tool▁calls▁begin｜>{% for c in m.tool_calls %}` +
		`{{ '<｜tool▁call▁begin｜>' + c['function']['name'] + '<｜tool▁sep｜>' + c['function']['arguments'] + '<｜tool▁call▁end｜>' }}` +
		`{% endfor %}<｜tool▁calls▁end｜>{% endif %}{% endfor %}{% if tools %}{% endif %}`
	tm, err := NewTemplate(src, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if tm.Format != FormatDeepSeek {
		t.Errorf("format %v, want %v", tm.Format, FormatDeepSeek)
	}
	out, e := tm.Render(formatsConversation(), true)
	if e != nil {
		t.Fatal(e)
	}
	want := `<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city":"Paris","days":3,"metric":true}<｜tool▁call▁end｜>`
	if !strings.Contains(out, want) {
		t.Errorf("rendering lacks %s:\n%s", want, out)
	}
	// The rendered turn parses back into the calls.
	turn := out[strings.Index(out, "Let me check."):]
	if _, calls := parseOutput(t, Options{Format: tm.Format, Tools: true, Parallel: true}, turn); cmp.Diff(formatsCalls, calls) != "" {
		t.Errorf("calls %v", calls)
	}
}

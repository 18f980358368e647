package grammar

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
)

func tools(names ...string) []runnerapi.Tool {
	var out []runnerapi.Tool
	for _, n := range names {
		out = append(out, runnerapi.Tool{Type: "function", Function: runnerapi.Function{Name: n,
			Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","maxLength":20}},"required":["city"]}`)}})
	}
	return out
}

// strictTools are tools with strict set.
func strictTools(names ...string) []runnerapi.Tool {
	out := tools(names...)
	yes := true
	for i := range out {
		out[i].Function.Strict = &yes
	}
	return out
}

func TestForChat(t *testing.T) {
	schema := &runnerapi.ResponseFormat{Type: "json_schema", JSONSchema: &runnerapi.JSONSchemaFormat{Name: "w",
		Schema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`)}}
	cases := []struct {
		name string
		in   Input
		// root and mf-calls rule bodies; nil spec when root is "".
		root, calls string
		schemas     []string
		errParam    string
	}{
		{name: "free text", in: Input{Format: chat.FormatHermes, Tools: tools("a")}},
		{name: "text format", in: Input{ResponseFormat: &runnerapi.ResponseFormat{Type: "text"}}},
		{name: "json object", in: Input{ResponseFormat: &runnerapi.ResponseFormat{Type: "json_object"}},
			root: "{{mf-answer}}", schemas: []string{"mf-answer"}},
		{name: "json schema", in: Input{ResponseFormat: schema}, root: "{{mf-answer}}", schemas: []string{"mf-answer"}},
		{name: "hermes required, one call", in: Input{Format: chat.FormatHermes, Tools: tools("a", "b"),
			ToolChoice: &runnerapi.ToolChoice{Mode: "required"}},
			root: "mf-calls", calls: `"<tool_call>\n" mf-call "\n</tool_call>"`, schemas: []string{"mf-args-0", "mf-args-1"}},
		{name: "hermes required, parallel", in: Input{Format: chat.FormatHermes, Tools: tools("a"),
			ToolChoice: &runnerapi.ToolChoice{Mode: "required"}, Parallel: true},
			root: "mf-calls", calls: `"<tool_call>\n" mf-call "\n</tool_call>" ( "\n" "<tool_call>\n" mf-call "\n</tool_call>" )*`,
			schemas: []string{"mf-args-0"}},
		{name: "named function keeps one tool", in: Input{Format: chat.FormatLlama3, Tools: tools("a", "b"),
			ToolChoice: &runnerapi.ToolChoice{Mode: "function", Function: "b"}},
			root: "mf-calls", calls: "mf-call", schemas: []string{"mf-args-0"}},
		{name: "mistral array", in: Input{Format: chat.FormatMistral, Tools: tools("a"),
			ToolChoice: &runnerapi.ToolChoice{Mode: "required"}, Parallel: true},
			root: "mf-calls", calls: `"[TOOL_CALLS][" mf-call ( ", " mf-call )* "]"`, schemas: []string{"mf-args-0"}},
		{name: "auto tools with a format: call or answer", in: Input{Format: chat.FormatHermes, Tools: tools("a"),
			ResponseFormat: schema},
			root: "mf-calls | {{mf-answer}}", calls: `"<tool_call>\n" mf-call "\n</tool_call>"`,
			schemas: []string{"mf-answer", "mf-args-0"}},
		{name: "tool_choice none with a format: answer only", in: Input{Format: chat.FormatHermes, Tools: tools("a"),
			ToolChoice: &runnerapi.ToolChoice{Mode: "none"}, ResponseFormat: schema},
			root: "{{mf-answer}}", schemas: []string{"mf-answer"}},
		{name: "reasoning first", in: Input{ResponseFormat: schema, InReasoning: true},
			root: "mf-reasoning ( {{mf-answer}} )", schemas: []string{"mf-answer"}},
		{name: "harmony required: one call, analysis first or not", in: Input{Format: chat.FormatHarmony, Tools: tools("a", "b"),
			ToolChoice: &runnerapi.ToolChoice{Mode: "required"}, Parallel: true},
			root: "mf-reasoning? ( mf-calls )", calls: "mf-call", schemas: []string{"mf-args-0", "mf-args-1"}},
		{name: "harmony json schema: the final channel's message", in: Input{Format: chat.FormatHarmony, ResponseFormat: schema},
			root: `mf-reasoning? ( "<|channel|>final<|message|>" {{mf-answer}} )`, schemas: []string{"mf-answer"}},
		{name: "harmony auto tools with a format: call or final answer", in: Input{Format: chat.FormatHarmony, Tools: tools("a"),
			ResponseFormat: schema},
			root: `mf-reasoning? ( mf-calls | "<|channel|>final<|message|>" {{mf-answer}} )`, calls: "mf-call",
			schemas: []string{"mf-answer", "mf-args-0"}},
		{name: "qwen3-coder held to JSON in its tags", in: Input{Format: chat.FormatQwen3Coder, Tools: tools("a"),
			ToolChoice: &runnerapi.ToolChoice{Mode: "required"}},
			root: "mf-calls", calls: `"<tool_call>\n" mf-call "\n</tool_call>"`, schemas: []string{"mf-args-0"}},
		{name: "deepseek section", in: Input{Format: chat.FormatDeepSeek, Tools: tools("a"),
			ToolChoice: &runnerapi.ToolChoice{Mode: "required"}, Parallel: true},
			root: "mf-calls", calls: `"<｜tool▁calls▁begin｜>" mf-call ( mf-call )* "<｜tool▁calls▁end｜>"`, schemas: []string{"mf-args-0"}},
		{name: "kimi section", in: Input{Format: chat.FormatKimi, Tools: tools("a"),
			ToolChoice: &runnerapi.ToolChoice{Mode: "required"}},
			root: "mf-calls", calls: `"<|tool_calls_section_begin|>" mf-call "<|tool_calls_section_end|>"`, schemas: []string{"mf-args-0"}},
		{name: "function-gemma required, parallel: its own syntax, no JSON schemas", in: Input{Format: chat.FormatFunctionGemma,
			Tools: tools("a"), ToolChoice: &runnerapi.ToolChoice{Mode: "required"}, Parallel: true},
			root: "mf-calls", calls: `"<start_function_call>" mf-call "<end_function_call>" ( "<start_function_call>" mf-call "<end_function_call>" )*`},
		{name: "function-gemma forced freeform refused", in: Input{Format: chat.FormatFunctionGemma,
			Tools:      []runnerapi.Tool{{Type: "function", Function: runnerapi.Function{Name: "p", InputGrammar: &runnerapi.InputGrammar{Syntax: "lark", Definition: `start: "x"`}}}},
			ToolChoice: &runnerapi.ToolChoice{Mode: "required"}}, errParam: "tools[0].function.input_grammar"},
		{name: "function-gemma unsupported keyword", in: Input{Format: chat.FormatFunctionGemma,
			Tools:      []runnerapi.Tool{{Type: "function", Function: runnerapi.Function{Name: "a", Parameters: json.RawMessage(`{"properties":{"d":{"type":"string","format":"date"}}}`)}}},
			ToolChoice: &runnerapi.ToolChoice{Mode: "required"}}, errParam: "tools[0].function.parameters"},
		{name: "function-gemma free with a format alone", in: Input{Format: chat.FormatFunctionGemma, ResponseFormat: schema},
			root: "{{mf-answer}}", schemas: []string{"mf-answer"}},
		{name: "strict under auto: the calls alone, lazily", in: Input{Format: chat.FormatHermes, Tools: append(tools("a"), strictTools("b")...)},
			root: "mf-calls", calls: `"<tool_call>\n" mf-call "\n</tool_call>"`, schemas: []string{"mf-args-0", "mf-args-1"}},
		{name: "strict under none: free", in: Input{Format: chat.FormatHermes, Tools: strictTools("a"),
			ToolChoice: &runnerapi.ToolChoice{Mode: "none"}}},
		{name: "strict under auto with a format: call or answer, eagerly", in: Input{Format: chat.FormatHermes, Tools: strictTools("a"),
			ResponseFormat: schema},
			root: "mf-calls | {{mf-answer}}", calls: `"<tool_call>\n" mf-call "\n</tool_call>"`,
			schemas: []string{"mf-answer", "mf-args-0"}},
		{name: "strict under auto for harmony: the call alone, lazily", in: Input{Format: chat.FormatHarmony, Tools: append(tools("a"), strictTools("b")...)},
			root: "mf-calls", calls: "mf-call", schemas: []string{"mf-args-0", "mf-args-1"}},
		{name: "strict under auto for function-gemma", in: Input{Format: chat.FormatFunctionGemma, Tools: strictTools("a")},
			root: "mf-calls", calls: `"<start_function_call>" mf-call "<end_function_call>"`},
		{name: "unsupported keyword in tool parameters", in: Input{Format: chat.FormatHermes,
			Tools:      []runnerapi.Tool{{Type: "function", Function: runnerapi.Function{Name: "a", Parameters: json.RawMessage(`{"not":{}}`)}}},
			ToolChoice: &runnerapi.ToolChoice{Mode: "required"}}, errParam: "tools[0].function.parameters"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, e := ForChat(tc.in)
			if tc.errParam != "" {
				if e == nil || e.Param != tc.errParam {
					t.Fatalf("error = %v, want one naming %s", e, tc.errParam)
				}
				return
			}
			if e != nil {
				t.Fatal(e)
			}
			if tc.root == "" {
				if s != nil {
					t.Fatalf("spec = %+v, want none", s)
				}
				return
			}
			if s == nil {
				t.Fatal("no spec")
			}
			if s.Rules["root"] != tc.root {
				t.Errorf("root = %q, want %q", s.Rules["root"], tc.root)
			}
			if s.Rules["mf-calls"] != tc.calls {
				t.Errorf("mf-calls = %q, want %q", s.Rules["mf-calls"], tc.calls)
			}
			if lazy := tc.in.ToolChoice == nil && !tc.in.ResponseFormat.Constrained(); lazy != (s.Triggers != nil) {
				t.Errorf("triggers = %q, want them only for strict tools under auto", s.Triggers)
			}
			var got []string
			for k := range s.Schemas {
				got = append(got, k)
			}
			if strings.Join(slices.Sorted(slices.Values(got)), ",") != strings.Join(tc.schemas, ",") {
				t.Errorf("schemas = %v, want %v", got, tc.schemas)
			}
		})
	}
}

func TestTriggers(t *testing.T) {
	cases := []struct {
		format      chat.Format
		inReasoning bool
		output      string
		want        string // what the grammar is fed from; "" for no trigger yet
	}{
		{chat.FormatHermes, false, "Let me check.", ""},
		{chat.FormatHermes, false, "Let me check.\n<tool_call>\n{\"na", "<tool_call>\n{\"na"},
		{chat.FormatHermes, false, "<tool_call", ""},
		{chat.FormatQwen3Coder, false, "<tool_call>", "<tool_call>"},
		{chat.FormatGLM, false, "ok <tool_call>", "<tool_call>"},
		{chat.FormatHermes, true, "maybe <tool_call> then", ""},
		{chat.FormatHermes, true, "maybe <tool_call></think>\n<tool_call>", "<tool_call>"},
		{chat.FormatDeepSeek, false, "x<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"},
		{chat.FormatKimi, false, "x<|tool_calls_section_begin|>", "<|tool_calls_section_begin|>"},
		{chat.FormatKimi, false, "x<tool_calls_section_begin>", ""},
		{chat.FormatMistral, false, "[TOOL_CALLS][{", "[TOOL_CALLS][{"},
		{chat.FormatMistral, false, "TOOL_CALLS", ""},
		{chat.FormatLlama3, false, ` {"name"`, `{"name"`},
		{chat.FormatLlama3, false, `It is {"a": 1}`, ""},
		{chat.FormatLlama3, true, "hm {</think>\n\n{", "{"},
		{chat.FormatNone, false, "\n{", "{"},
		{chat.FormatHarmony, false, "<|channel|>analysis<|message|>call get_time<|end|><|start|>assistant<|channel|>commentary to=functions.get",
			"<|channel|>commentary to=functions.get"},
		{chat.FormatHarmony, false, "<|channel|>commentary<|message|>Checking.", ""},
		{chat.FormatFunctionGemma, false, "Sure.<start_function_call>call:", "<start_function_call>call:"},
		{chat.FormatFunctionGemma, false, "call:get_time{}", ""},
	}
	for _, tc := range cases {
		triggers := Triggers(tc.format, tc.inReasoning)
		if len(triggers) == 0 {
			t.Fatalf("%v: no triggers", tc.format)
		}
		got := ""
		for _, p := range triggers {
			// Go's RE2 reads these patterns as the runner's ECMAScript engine does.
			if m := regexp.MustCompile(`^(?:` + p + `)$`).FindStringSubmatchIndex(tc.output); m != nil {
				got = tc.output[m[2]:]
				break
			}
		}
		if got != tc.want {
			t.Errorf("%v (reasoning %v) on %q: fed %q, want %q", tc.format, tc.inReasoning, tc.output, got, tc.want)
		}
	}
}

func TestCallRuleNamesTheFunction(t *testing.T) {
	for _, tc := range []struct {
		format chat.Format
		want   string
	}{
		{chat.FormatHermes, `"{\"name\": \"get_weather\", \"arguments\": " {{mf-args-0}} "}"`},
		{chat.FormatLlama3, `"{\"name\": \"get_weather\", \"parameters\": " {{mf-args-0}} "}"`},
		{chat.FormatDeepSeek, `"<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" {{mf-args-0}} "<｜tool▁call▁end｜>"`},
		{chat.FormatKimi, `"<|tool_call_begin|>functions.get_weather:" [0-9] [0-9]? "<|tool_call_argument_begin|>" {{mf-args-0}} "<|tool_call_end|>"`},
		{chat.FormatHarmony, `"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" {{mf-args-0}}`},
		{chat.FormatFunctionGemma, `"call:get_weather{" mf-args-0 "}"`},
	} {
		s, e := ForChat(Input{Format: tc.format, Tools: tools("get_weather"), ToolChoice: &runnerapi.ToolChoice{Mode: "required"}})
		if e != nil {
			t.Fatal(e)
		}
		if got := s.Rules["mf-call-0"]; got != tc.want {
			t.Errorf("%v: mf-call-0 = %s, want %s", tc.format, got, tc.want)
		}
	}
}

func TestCheckSchema(t *testing.T) {
	cases := []struct {
		schema string
		want   string // substring of the error; "" for none
	}{
		{`{"type":"object","properties":{"a":{"type":"string","maxLength":5,"description":"x"},"b":{"type":["integer","null"],"minimum":0}},"required":["a"],"additionalProperties":false}`, ""},
		{`{"$defs":{"p":{"type":"string","format":"date"}},"type":"array","items":{"$ref":"#/$defs/p"},"maxItems":3}`, ""},
		{`{"anyOf":[{"const":1},{"enum":["x","y"]}]}`, ""},
		{`{"type":"object","properties":{"a":{"not":{"type":"string"}}}}`, `keyword "not" (at "/properties/a/not")`},
		{`{"type":"string","format":"email"}`, `format email`},
		{`{"type":"objekt"}`, `type objekt`},
		{`{"type":"array","uniqueItems":true}`, `"uniqueItems"`},
		{`{"patternProperties":{"^x":{}}}`, `"patternProperties"`},
		{`{"properties":[]}`, `properties at "/properties" must be an object`},
		{`[1]`, `must be an object or a boolean`},
		{`{`, `not valid JSON`},
	}
	for _, tc := range cases {
		e := CheckSchema(json.RawMessage(tc.schema), "response_format.json_schema.schema")
		switch {
		case tc.want == "" && e != nil:
			t.Errorf("%s: %v", tc.schema, e)
		case tc.want != "" && (e == nil || !strings.Contains(e.Message, tc.want)):
			t.Errorf("%s: error %v, want one containing %q", tc.schema, e, tc.want)
		case e != nil && e.Param != "response_format.json_schema.schema":
			t.Errorf("%s: param %q", tc.schema, e.Param)
		}
	}
}

func TestLiteral(t *testing.T) {
	if got, want := literal("a\"b\\c\n\x01"), `"a\"b\\c\n\x01"`; got != want {
		t.Errorf("literal = %s, want %s", got, want)
	}
}

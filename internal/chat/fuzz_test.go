package chat_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
	"github.com/macfleet/macfleet/internal/chat/grammar"
	"github.com/macfleet/macfleet/test/support/testassets"
)

var (
	fuzzTemplatesOnce sync.Once
	fuzzTemplates     []*chat.Template
	fuzzTemplatesErr  error
)

// templatesForFuzz are one real template of each family that parses (read from the
// module cache, as every template test here).
func templatesForFuzz(f *testing.F) []*chat.Template {
	fuzzTemplatesOnce.Do(func() {
		all, err := testassets.ChatTemplates()
		if err != nil {
			fuzzTemplatesErr = err
			return
		}
		seen := map[string]bool{}
		for _, c := range all {
			if seen[c.Family] {
				continue
			}
			if t, err := chat.NewTemplate(c.Source, "<s>", "</s>"); err == nil {
				seen[c.Family] = true
				fuzzTemplates = append(fuzzTemplates, t)
			}
		}
	})
	if fuzzTemplatesErr != nil {
		f.Fatal(fuzzTemplatesErr)
	}
	if len(fuzzTemplates) < 10 {
		f.Fatalf("only %d template families parse", len(fuzzTemplates))
	}
	return fuzzTemplates
}

func wantClientError(t *testing.T, what string, e *runnerapi.Error) {
	t.Helper()
	if e != nil && (e.Status != http.StatusBadRequest || e.Message == "") {
		t.Fatalf("%s: %d %q, want a 400 with a message", what, e.Status, e.Message)
	}
}

// FuzzChatRequest: any body a client sends to /v1/chat/completions is refused with a
// 400 that says why, or renders through every template family and builds its
// grammar, without a panic.
func FuzzChatRequest(f *testing.F) {
	templates := templatesForFuzz(f)
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"Hi"}]}`,
		`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Weather?"}]},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"21C"}],"tools":[{"type":"function","function":{"name":"get_weather",` +
			`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],"tool_choice":"required"}`,
		`{"model":"m","messages":[{"role":"user","content":"A person"}],"response_format":{"type":"json_schema","json_schema":` +
			`{"name":"p","strict":true,"schema":{"type":"object","properties":{"age":{"type":"integer","minimum":0}},"required":["age"]}}}}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":false},"reasoning_effort":"low"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req runnerapi.ChatRequest
		if e := runnerapi.DecodeJSON(body, &req); e != nil {
			wantClientError(t, "decoding", e)
			return
		}
		_, e := req.Options()
		if e == nil {
			e = req.Check()
		}
		if e != nil {
			wantClientError(t, "checking", e)
			return
		}
		in := chat.InputOf(&req)
		for _, tm := range templates {
			_, e := tm.Render(in, true)
			wantClientError(t, "rendering", e)
			spec, e := grammar.ForChat(grammar.Input{Format: tm.Format, Tools: req.Tools, ToolChoice: req.ToolChoice,
				Parallel: req.ParallelToolCalls == nil || *req.ParallelToolCalls, ResponseFormat: req.ResponseFormat})
			wantClientError(t, "grammar", e)
			if spec != nil {
				if schemas, _ := spec.JSON(); !json.Valid(schemas) {
					t.Fatalf("grammar schemas are not JSON: %s", schemas)
				}
			}
		}
	})
}

// FuzzParser: any model output, in any format and cut anywhere, parses without a
// panic, and every tool call it yields has a name (not blank, no space around it) and
// JSON arguments.
func FuzzParser(f *testing.F) {
	f.Add(`<think>hm</think>Sure.<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>`, uint8(1), uint16(9))
	f.Add(`<|python_tag|>{"name":"f","parameters":{"a":"b"}}; {"name":"g","parameters":{}}`, uint8(2), uint16(5))
	f.Add(`[TOOL_CALLS][{"name":"f","arguments":{"x":[1,2]}}]`, uint8(3), uint16(3))
	f.Add(`[TOOL_CALLS]f[ARGS]{"x":1}`, uint8(3), uint16(12))
	f.Add(`<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a":1}<|call|>`, uint8(4), uint16(20))
	f.Add(`{"name": "f", "arguments": {"a": [1, {"b": "}"}]}}`, uint8(0), uint16(7))
	f.Add("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>", uint8(5), uint16(14))
	f.Add("<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", uint8(6), uint16(20))
	f.Add(`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a":1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>`, uint8(7), uint16(30))
	f.Add(`<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a":1}<|tool_call_end|><|tool_calls_section_end|>`, uint8(8), uint16(40))
	f.Add(`<start_function_call>call:f{a:<escape>x<escape>}<end_function_call>`, uint8(9), uint16(25))
	f.Fuzz(func(t *testing.T, out string, format uint8, cut uint16) {
		for _, tools := range []bool{true, false} {
			p := chat.NewParser(chat.Options{Format: chat.Format(format % 10), Tools: tools, Thinking: true, Parallel: true,
				Defs: []runnerapi.Tool{{Type: "function", Function: runnerapi.Function{Name: "f",
					Parameters: json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"}}}`)}}}})
			i := int(cut) % (len(out) + 1)
			ds := []chat.Delta{p.Push(out[:i]), p.Push(out[i:]), p.Finish()}
			for _, d := range ds {
				for _, c := range d.ToolCalls {
					if !tools {
						t.Fatalf("a tool call without tools: %+v", c)
					}
					if n := c.Function.Name; n == "" || n != strings.TrimSpace(n) || !json.Valid([]byte(c.Function.Arguments)) {
						t.Fatalf("call %+v: want a name and JSON arguments (output %q)", c, out)
					}
				}
			}
		}
	})
}

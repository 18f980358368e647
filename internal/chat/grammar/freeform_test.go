package grammar

import (
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
)

// TestForChatFreeform: a freeform tool's call holds its input to its grammar, written
// inside the arguments' JSON string; under "auto" lazily where the format's call
// opener is known, and not at all where it is not; a grammar that cannot be
// translated is a 400 naming the tool's grammar.
func TestForChatFreeform(t *testing.T) {
	tool := runnerapi.Tool{Type: "function", Function: runnerapi.Function{Name: "apply_patch",
		InputGrammar: &runnerapi.InputGrammar{Syntax: "lark", Definition: "start: \"+\" /[a-z]+/ LF\n%import common.LF"}}}
	named := &runnerapi.ToolChoice{Mode: "function", Function: "apply_patch"}
	for _, tc := range []struct {
		name     string
		in       Input
		call     string // the call rule, "" for no constraint
		triggers bool
	}{
		{"forced hermes", Input{Format: chat.FormatHermes, Tools: []runnerapi.Tool{tool}, ToolChoice: named},
			`"{\"name\": \"apply_patch\", \"arguments\": " mf-args-0 "}"`, false},
		{"forced llama3", Input{Format: chat.FormatLlama3, Tools: []runnerapi.Tool{tool}, ToolChoice: named},
			`"{\"name\": \"apply_patch\", \"parameters\": " mf-args-0 "}"`, false},
		{"auto hermes", Input{Format: chat.FormatHermes, Tools: []runnerapi.Tool{tool}},
			`"{\"name\": \"apply_patch\", \"arguments\": " mf-args-0 "}"`, true},
		{"auto harmony", Input{Format: chat.FormatHarmony, Tools: []runnerapi.Tool{tool}},
			`"<|channel|>commentary to=functions.apply_patch <|constrain|>json<|message|>" mf-args-0`, true},
		{"auto function-gemma: no input syntax, free", Input{Format: chat.FormatFunctionGemma, Tools: []runnerapi.Tool{tool}}, "", false},
	} {
		s, e := ForChat(tc.in)
		if e != nil {
			t.Errorf("%s: %v", tc.name, e)
			continue
		}
		if tc.call == "" {
			if s != nil {
				t.Errorf("%s: constrained: %+v", tc.name, s.Rules)
			}
			continue
		}
		if s == nil || s.Rules["mf-call-0"] != tc.call || (s.Triggers != nil) != tc.triggers ||
			!strings.Contains(s.Rules["mf-args-0"], `"{\"input\": \""`) || s.Rules["mf-args-0-start"] == "" || len(s.Schemas) != 0 {
			t.Errorf("%s: %+v", tc.name, s)
		}
	}
	bad := tool
	bad.Function.InputGrammar = &runnerapi.InputGrammar{Syntax: "lark", Definition: "start: a\na: a \"x\""}
	_, e := ForChat(Input{Format: chat.FormatHermes, Tools: []runnerapi.Tool{bad}, ToolChoice: named})
	if e == nil || e.Param != "tools[0].function.input_grammar" || !strings.Contains(e.Message, "left-recursive") {
		t.Errorf("a left-recursive grammar: %+v", e)
	}
}

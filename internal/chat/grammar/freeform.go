package grammar

import (
	"fmt"
	"maps"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
	"github.com/macfleet/macfleet/internal/chat/lark"
)

// addFreeform adds the call rule of tool i, a freeform tool (runnerapi.InputGrammar):
// its arguments are {"input": "..."} with the text held to the tool's grammar
// (internal/chat/lark), written inside the JSON string.
func (s *Spec) addFreeform(f chat.Format, t runnerapi.Tool, i int, key string) *runnerapi.Error {
	g, err := lark.Parse(t.Function.InputGrammar.Syntax, t.Function.InputGrammar.Definition)
	if err != nil {
		return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, fmt.Sprintf("tools[%d].function.input_grammar", i),
			"the grammar of %s cannot be enforced: %v", t.Function.Name, err)
	}
	args := fmt.Sprintf("mf-args-%d", i)
	maps.Copy(s.Rules, g.ArgumentRules(args))
	s.Rules[fmt.Sprintf("mf-call-%d", i)] = strings.Replace(callRule(f, t.Function.Name, key, args), "{{"+args+"}}", args, 1)
	return nil
}

// onlyFreeform reports whether no tool is strict but freeform ones (which the lazy
// grammar holds where it can, and leaves free where it cannot).
func onlyFreeform(tools []runnerapi.Tool) bool {
	for _, t := range tools {
		if t.Function.Strict != nil && *t.Function.Strict {
			return false
		}
	}
	return true
}

package translate

import (
	"encoding/json"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/lark"
)

// Freeform (custom) tools of the Responses API: the model writes a call's input as
// raw text, not JSON arguments, held to the tool's grammar where it has one (Codex's
// apply_patch sends a Lark grammar). To the model (its chat template and call
// syntax) such a tool is a function of one string parameter, "input"; the runner
// holds that string to the grammar (runnerapi.InputGrammar); the call comes back as a
// custom_tool_call item whose input is the string.

// customTool is a Responses tool of type "custom".
type customTool struct {
	Type        string `json:"type"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Format      *struct {
		Type       string `json:"type"`
		Syntax     string `json:"syntax,omitempty"`
		Definition string `json:"definition,omitempty"`
	} `json:"format,omitempty"`
	DeferLoading *bool `json:"defer_loading,omitempty"`
	// Async (a call answered in a later response) and AllowedCallers (direct or
	// programmatic calls) are hints: the call is returned at once, to the client.
	Async          *bool    `json:"async,omitempty"`
	AllowedCallers []string `json:"allowed_callers,omitempty"`
}

// customFunction is the function tool a custom tool is shown to the model as, and its
// grammar (nil for a text format: any text); it names the tool's hints in t.hints.
func (t *translated) customFunction(raw json.RawMessage, param string) (ResponsesTool, *runnerapi.InputGrammar, *chatError) {
	var c customTool
	if e := decodeStrict(raw, &c, nil, param); e != nil {
		return ResponsesTool{}, nil, e
	}
	if c.Async != nil && *c.Async {
		t.hints = append(t.hints, "tools[].async")
	}
	if len(c.AllowedCallers) > 0 && !slices.Equal(c.AllowedCallers, []string{"direct"}) {
		t.hints = append(t.hints, "tools[].allowed_callers")
	}
	input := map[string]any{"type": "string", "description": "The tool's input, as raw text (not JSON)."}
	var g *runnerapi.InputGrammar
	if f := c.Format; f != nil {
		switch f.Type {
		case "text":
			if f.Syntax != "" || f.Definition != "" {
				return ResponsesTool{}, nil, invalid(param+".format", "a text format has no syntax or definition")
			}
		case "grammar":
			if f.Syntax != "lark" && f.Syntax != "regex" {
				return ResponsesTool{}, nil, invalid(param+".format.syntax", "a grammar's syntax must be lark or regex, got %q", f.Syntax)
			}
			if _, err := lark.Parse(f.Syntax, f.Definition); err != nil {
				return ResponsesTool{}, nil, unsupported(param+".format.definition", "the grammar of custom tool %q cannot be enforced: %v", c.Name, err)
			}
			g = &runnerapi.InputGrammar{Syntax: f.Syntax, Definition: f.Definition}
			input["description"] = "The tool's input, as raw text (not JSON), in the language of this " + f.Syntax +
				" grammar:\n" + f.Definition
		default:
			return ResponsesTool{}, nil, invalid(param+".format.type", "a custom tool's format type must be text or grammar, got %q", f.Type)
		}
	}
	params, _ := json.Marshal(map[string]any{"type": "object", "properties": map[string]any{"input": input},
		"required": []string{"input"}, "additionalProperties": false})
	return ResponsesTool{Type: "function", Name: c.Name, Description: c.Description, Parameters: params,
		DeferLoading: c.DeferLoading}, g, nil
}

// customArguments are the arguments of a call to a custom tool with input.
func customArguments(input string) string {
	b, _ := json.Marshal(map[string]string{"input": input})
	return string(b)
}

// customInput is the input of a custom tool's call from its arguments: the string
// "input", or the arguments as written where they are not that object (a model
// the grammar did not hold).
func customInput(args string) string {
	var a struct {
		Input *string `json:"input"`
	}
	if json.Unmarshal([]byte(args), &a) == nil && a.Input != nil {
		return *a.Input
	}
	return args
}

// customInputSoFar is the input decoded from a call's arguments streamed so far:
// the "input" string up to its last whole character (a partial escape, a lone high
// surrogate or a cut UTF-8 sequence waits for the rest), "" before it opens.
func customInputSoFar(args string) string {
	i := strings.Index(args, `"input"`)
	if i < 0 {
		return ""
	}
	rest := strings.TrimLeft(args[i+len(`"input"`):], " \t\r\n")
	rest, ok := strings.CutPrefix(rest, ":")
	if !ok {
		return ""
	}
	rest, ok = strings.CutPrefix(strings.TrimLeft(rest, " \t\r\n"), `"`)
	if !ok {
		return ""
	}
	end := 0 // the end of the last whole character
	for j := 0; j < len(rest); {
		switch c := rest[j]; {
		case c == '"':
			return decodeJSONString(rest[:j])
		case c == '\\':
			n := 2
			if j+1 < len(rest) && rest[j+1] == 'u' {
				n = 6
				if j+n <= len(rest) && (rest[j+2] == 'd' || rest[j+2] == 'D') && strings.ContainsRune("89abAB", rune(rest[j+3])) {
					n = 12 // a surrogate pair
				}
			}
			if j+n > len(rest) {
				return decodeJSONString(rest[:end])
			}
			j += n
		default:
			if !utf8.FullRuneInString(rest[j:]) {
				return decodeJSONString(rest[:end])
			}
			_, n := utf8.DecodeRuneInString(rest[j:])
			j += n
		}
		end = j
	}
	return decodeJSONString(rest[:end])
}

func decodeJSONString(body string) string {
	var s string
	if json.Unmarshal([]byte(`"`+body+`"`), &s) != nil {
		return ""
	}
	return s
}

func customCallItem(id, callID, name, input string) map[string]any {
	return map[string]any{"type": "custom_tool_call", "id": id, "call_id": callID, "name": name, "input": input}
}

// customDelta streams what the open custom tool call's input has gained.
func (s *responseState) customDelta() {
	input := customInputSoFar(s.text.String())
	if len(input) <= len(s.inputSent) || !strings.HasPrefix(input, s.inputSent) {
		return
	}
	s.send("response.custom_tool_call_input.delta", map[string]any{"item_id": s.currentID(),
		"output_index": len(s.output) - 1, "delta": input[len(s.inputSent):]})
	s.inputSent = input
}

// customDone finishes the open custom tool call (at output index idx) with its
// input's done event, and returns the completed item.
func (s *responseState) customDone(idx int) map[string]any {
	input := customInput(s.text.String())
	s.send("response.custom_tool_call_input.done", map[string]any{"item_id": s.currentID(), "output_index": idx, "input": input})
	prev := s.output[idx]
	s.inputSent = ""
	return customCallItem(prev["id"].(string), prev["call_id"].(string), prev["name"].(string), input)
}

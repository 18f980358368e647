// Package grammar decides what a chat request constrains the model's output to —
// a JSON schema (response_format), a forced tool call in the model's own call syntax
// (tool_choice "required" or a named function), both as alternatives, or, for strict
// tools under tool_choice "auto", the calls alone once the model opens one — and
// describes it as JSON schemas plus GBNF rules for llama.cpp's converter and grammar
// sampler. It is pure: the runner turns a Spec into a grammar.
package grammar

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
)

// Spec is a constraint: named JSON schemas and named GBNF rule bodies, one of them
// "root", in which {{name}} stands for a value of the schema of that name.
type Spec struct {
	Schemas map[string]json.RawMessage
	Rules   map[string]string
	// Param is the request field the constraint comes from, for errors.
	Param string
	// Triggers, when set, make the constraint lazy (strict tools under "auto"): the
	// output is free until the text so far matches one of these regular expressions
	// (ECMAScript, matched against the whole output), and the grammar holds from the
	// start of the first group on — the call's opener, which root begins with.
	Triggers []string

	// b is what the schemas have spent of MaxSchemaWeight.
	b *budget
}

// JSON returns the schemas and rules as the JSON objects the converter takes.
func (s *Spec) JSON() (schemas, rules []byte) {
	schemas, _ = json.Marshal(s.Schemas)
	rules, _ = json.Marshal(s.Rules)
	return schemas, rules
}

// Input is what of a request and model decides the constraint.
type Input struct {
	Format         chat.Format
	Tools          []runnerapi.Tool
	ToolChoice     *runnerapi.ToolChoice
	Parallel       bool
	ResponseFormat *runnerapi.ResponseFormat
	// InReasoning: the prompt leaves the model inside an open <think> block, which
	// it may finish before the constrained part.
	InReasoning bool
}

// ForChat returns the constraint of a chat request, or nil when the output is free.
func ForChat(in Input) (*Spec, *runnerapi.Error) {
	forced := in.ToolChoice != nil && (in.ToolChoice.Mode == "required" || in.ToolChoice.Mode == "function")
	callable := len(in.Tools) > 0 && (in.ToolChoice == nil || in.ToolChoice.Mode != "none")
	format := in.ResponseFormat.Constrained()
	if !forced && !format {
		if callable && strictTool(in.Tools) >= 0 {
			return forStrict(in)
		}
		return nil, nil
	}
	s := &Spec{Schemas: map[string]json.RawMessage{}, Rules: map[string]string{}, b: &budget{}}
	var alts []string
	if forced || callable && format {
		if e := s.addCalls(in.Format, chosenTools(in), in.Parallel); e != nil {
			return nil, e
		}
		alts = append(alts, "mf-calls")
		s.Param = "tools"
	}
	if format && !forced {
		schema := json.RawMessage(`{"type":"object"}`)
		if in.ResponseFormat.Type == "json_schema" {
			schema = in.ResponseFormat.JSONSchema.Schema
			if e := checkSchema(s.b, schema, "response_format.json_schema.schema"); e != nil {
				return nil, e
			}
		}
		s.Schemas["mf-answer"] = schema
		answer := "{{mf-answer}}"
		if in.Format == chat.FormatHarmony { // the answer is the final channel's message
			answer = literal(harmonyFinal) + " " + answer
		}
		alts = append(alts, answer)
		s.Param = "response_format"
	}
	s.Rules["root"] = s.reasoningFirst(in, strings.Join(alts, " | "))
	return s, nil
}

// chosenTools are the tools a forced call may call: the named one, or all.
func chosenTools(in Input) []runnerapi.Tool {
	if in.ToolChoice != nil && in.ToolChoice.Mode == "function" {
		for _, t := range in.Tools {
			if t.Function.Name == in.ToolChoice.Function {
				return []runnerapi.Tool{t}
			}
		}
	}
	return in.Tools
}

// The harmony format's messages (gpt-oss): the prompt ends at "<|start|>assistant",
// and the answer is one or more messages, each a channel's header and its text.
// Reasoning is the analysis channel; the answer the final one; a call a commentary
// message to the function, its arguments JSON, ended by <|call|> (an end-of-generation
// token, which no grammar holds: the constrained part ends at the arguments).
const (
	harmonyAnalysis = "<|channel|>analysis<|message|>"
	harmonyFinal    = "<|channel|>final<|message|>"
	harmonyCall     = "<|channel|>commentary to=functions."
)

// reasoningFirst is the root rule of body with the reasoning the format lets the
// model write before it: the rest of an open <think> block, or an optional harmony
// analysis message.
func (s *Spec) reasoningFirst(in Input, body string) string {
	switch {
	case in.Format == chat.FormatHarmony:
		// An analysis message and the next message's start. Its text may hold "<" (code
		// does), never "<|", which opens the format's marks.
		s.Rules["mf-reasoning"] = literal(harmonyAnalysis) + ` ( [^<] | "<" [^|] )* "<|end|>" [ \t\n]* "<|start|>assistant"`
		return "mf-reasoning? ( " + body + " )"
	case in.InReasoning:
		// Reasoning text (no "<") until the block closes, then the constrained part.
		s.Rules["mf-reasoning"] = `[^<]* "</think>" [ \t\n]*`
		return "mf-reasoning ( " + body + " )"
	}
	return body
}

// strictTool is the index of the first tool with strict set, or -1.
func strictTool(tools []runnerapi.Tool) int {
	for i, t := range tools {
		if t.Function.Strict != nil && *t.Function.Strict || t.Function.InputGrammar != nil {
			return i
		}
	}
	return -1
}

// forStrict is the lazy constraint of strict tools under tool_choice "auto": text is
// free, and once the model writes its format's call opener the calls (to any of the
// tools, each by its schema) are held to the grammar to their end.
func forStrict(in Input) (*Spec, *runnerapi.Error) {
	triggers := Triggers(in.Format, in.InReasoning)
	if onlyFreeform(in.Tools) && (triggers == nil || in.Format == chat.FormatFunctionGemma) {
		return nil, nil // freeform tools are free where no call opener or input syntax is known
	}
	if triggers == nil {
		return nil, runnerapi.InvalidRequest(runnerapi.CodeUnsupportedParameter,
			fmt.Sprintf("tools[%d].function.strict", strictTool(in.Tools)),
			"strict tool arguments under tool_choice \"auto\" are not supported yet for models that write the %s format: "+
				"set tool_choice to \"required\" or name the function, or leave strict unset", in.Format)
	}
	s := &Spec{Schemas: map[string]json.RawMessage{}, Rules: map[string]string{}, b: &budget{}, Param: "tools",
		Triggers: triggers}
	if e := s.addCalls(in.Format, in.Tools, in.Parallel); e != nil {
		return nil, e
	}
	s.Rules["root"] = "mf-calls"
	return s, nil
}

// Triggers are the patterns that open a call in format f (see Spec.Triggers), nil
// where constrained calls are not supported. A call opens at the format's opening tag
// anywhere in the text, or, for formats whose call is the whole answer (Llama 3 JSON,
// bare JSON), at a "{" that starts it. With reasoning open in the prompt, only after
// the model closes it.
func Triggers(f chat.Format, inReasoning bool) []string {
	var opener string
	anywhere := true
	switch f {
	case chat.FormatHermes, chat.FormatQwen3Coder, chat.FormatGLM:
		opener = "<tool_call>"
	case chat.FormatDeepSeek:
		opener = "<｜tool▁calls▁begin｜>"
	case chat.FormatKimi:
		opener = "<|tool_calls_section_begin|>"
	case chat.FormatMistral:
		opener = "[TOOL_CALLS]"
	case chat.FormatHarmony:
		opener = harmonyCall
	case chat.FormatFunctionGemma:
		opener = gemmaCallBegin
	case chat.FormatLlama3, chat.FormatNone:
		opener, anywhere = "{", false
	default:
		return nil
	}
	start := `^`
	if inReasoning {
		start = `^[\s\S]*?</think>`
	}
	before := `\s*`
	if anywhere {
		before = `[\s\S]*?`
	}
	return []string{start + before + "(" + regexp.QuoteMeta(opener) + `)[\s\S]*`}
}

// addCalls adds the rule mf-calls: one call (or, with parallel, one or more) to any
// of tools in the model's call syntax, arguments by each tool's parameter schema.
func (s *Spec) addCalls(f chat.Format, tools []runnerapi.Tool, parallel bool) *runnerapi.Error {
	key := "arguments"
	if f == chat.FormatLlama3 {
		key = "parameters"
	}
	var calls []string
	for i, t := range tools {
		if f == chat.FormatFunctionGemma {
			if e := s.addGemmaCall(t, i); e != nil {
				return e
			}
			calls = append(calls, fmt.Sprintf("mf-call-%d", i))
			continue
		}
		if t.Function.InputGrammar != nil { // a freeform tool: its input by its grammar
			if e := s.addFreeform(f, t, i, key); e != nil {
				return e
			}
			calls = append(calls, fmt.Sprintf("mf-call-%d", i))
			continue
		}
		params := t.Function.Parameters
		if len(strings.TrimSpace(string(params))) == 0 || string(params) == "null" {
			params = json.RawMessage(`{"type":"object"}`)
		}
		if e := checkSchema(s.b, params, fmt.Sprintf("tools[%d].function.parameters", i)); e != nil {
			return e
		}
		args := fmt.Sprintf("mf-args-%d", i)
		s.Schemas[args] = params
		rule := fmt.Sprintf("mf-call-%d", i)
		s.Rules[rule] = callRule(f, t.Function.Name, key, args)
		calls = append(calls, rule)
	}
	s.Rules["mf-call"] = strings.Join(calls, " | ")
	var one, sep, open, closing string
	switch f {
	case chat.FormatHermes, chat.FormatQwen3Coder, chat.FormatGLM:
		// Qwen3-Coder and GLM models are held to JSON in their <tool_call> tags, which
		// the parser reads as well as their own syntax.
		one = `"<tool_call>\n" mf-call "\n</tool_call>"`
		sep = `"\n"`
	case chat.FormatDeepSeek:
		open, closing = literal("<｜tool▁calls▁begin｜>")+" ", " "+literal("<｜tool▁calls▁end｜>")
		one = "mf-call"
	case chat.FormatKimi:
		open, closing = literal("<|tool_calls_section_begin|>")+" ", " "+literal("<|tool_calls_section_end|>")
		one = "mf-call"
	case chat.FormatMistral:
		open, closing = `"[TOOL_CALLS][" `, ` "]"`
		one, sep = "mf-call", `", "`
	case chat.FormatLlama3:
		one, sep = "mf-call", `"; "`
	case chat.FormatHarmony:
		// A call ends the output (<|call|> ends generation): one call, parallel or not.
		one, parallel = "mf-call", false
	case chat.FormatFunctionGemma:
		one = literal(gemmaCallBegin) + " mf-call " + literal(gemmaCallEnd)
	default: // no known syntax: bare JSON objects, which the parser recognises
		one, sep = "mf-call", `"\n"`
	}
	body := one
	if parallel {
		body = one + " ( " + strings.TrimSpace(sep+" "+one) + " )*"
	}
	s.Rules["mf-calls"] = open + body + closing
	return nil
}

// callRule is the rule of one call of the function name in format f, its arguments
// the schema rule args.
func callRule(f chat.Format, name, key, args string) string {
	switch f {
	case chat.FormatDeepSeek:
		return fmt.Sprintf(`%s {{%s}} %s`, literal("<｜tool▁call▁begin｜>"+name+"<｜tool▁sep｜>"), args, literal("<｜tool▁call▁end｜>"))
	case chat.FormatHarmony:
		return fmt.Sprintf(`%s {{%s}}`, literal(harmonyCall+name+" <|constrain|>json<|message|>"), args)
	case chat.FormatKimi:
		// The call's index: at most two digits, or a weak model writes digits forever.
		return fmt.Sprintf(`%s [0-9] [0-9]? %s {{%s}} %s`, literal("<|tool_call_begin|>functions."+name+":"),
			literal("<|tool_call_argument_begin|>"), args, literal("<|tool_call_end|>"))
	}
	return fmt.Sprintf(`%s {{%s}} "}"`, literal(fmt.Sprintf(`{"name": %q, %q: `, name, key)), args)
}

// literal quotes text as a GBNF string literal.
func literal(text string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range text {
		switch r {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\x%02X`, r)
				continue
			}
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

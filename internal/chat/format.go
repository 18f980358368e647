package chat

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"strings"

	"github.com/ollama/ollama/api"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// Format is how a model family writes tool calls in its output.
type Format int

const (
	// FormatNone: the template shows no known tool-call syntax; JSON objects in the
	// Hermes or Llama style are still recognised.
	FormatNone Format = iota
	// FormatHermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block
	// per call (Qwen 2.5 and 3, Hermes, many fine-tunes).
	FormatHermes
	// FormatLlama3: the whole answer is {"name": ..., "parameters": {...}}, optionally
	// after <|python_tag|>; several calls are separated by ";" (Llama 3.1 to 3.3).
	FormatLlama3
	// FormatMistral: [TOOL_CALLS] followed by a JSON array of {"name", "arguments"},
	// or by name[ARGS]{...} per call (newer Mistral templates).
	FormatMistral
	// FormatHarmony: gpt-oss channels; commentary addressed to=functions.NAME carries
	// a call, analysis is reasoning, final is the answer.
	FormatHarmony
	// FormatQwen3Coder: <tool_call><function=NAME><parameter=KEY>VALUE</parameter>…
	// </function></tool_call>, values as text typed by the tool's schema.
	FormatQwen3Coder
	// FormatGLM: <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>…
	// </tool_call> (GLM 4.5 to 4.7, with or without newlines between the parts).
	FormatGLM
	// FormatDeepSeek: <｜tool▁calls▁begin｜>, then per call <｜tool▁call▁begin｜>NAME
	// <｜tool▁sep｜>{...}<｜tool▁call▁end｜>, then <｜tool▁calls▁end｜> (DeepSeek V3.1).
	FormatDeepSeek
	// FormatKimi: <|tool_calls_section_begin|>, then per call <|tool_call_begin|>
	// functions.NAME:N<|tool_call_argument_begin|>{...}<|tool_call_end|>, then
	// <|tool_calls_section_end|> (Kimi K2).
	FormatKimi
	// FormatFunctionGemma: <start_function_call>call:NAME{KEY:VALUE,…}<end_function_call>,
	// strings between <escape> marks (the function-calling Gemma 3).
	FormatFunctionGemma
)

var formatNames = map[Format]string{FormatNone: "none", FormatHermes: "hermes", FormatLlama3: "llama3-json",
	FormatMistral: "mistral", FormatHarmony: "harmony", FormatQwen3Coder: "qwen3-coder", FormatGLM: "glm",
	FormatDeepSeek: "deepseek-v3.1", FormatKimi: "kimi-k2", FormatFunctionGemma: "function-gemma"}

func (f Format) String() string { return formatNames[f] }

// Markers are the special token texts a format needs to see in the output; a runner
// renders these tokens' text even when they are control tokens.
func (f Format) Markers() []string {
	switch f {
	case FormatHermes:
		return []string{"<tool_call>", "</tool_call>"}
	case FormatLlama3:
		return []string{"<|python_tag|>"}
	case FormatMistral:
		return []string{"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"}
	case FormatHarmony:
		return []string{"<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|start|>", "<|call|>", "<|return|>"}
	case FormatQwen3Coder:
		return []string{"<tool_call>", "</tool_call>"}
	case FormatGLM:
		return []string{"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"}
	case FormatDeepSeek:
		return []string{deepseekCallsBegin, deepseekCallsEnd, deepseekCallBegin, deepseekCallEnd, deepseekSep}
	case FormatKimi:
		return []string{kimiSectionBegin, kimiSectionEnd, kimiCallBegin, kimiArgBegin, kimiCallEnd}
	case FormatFunctionGemma:
		return []string{gemmaCallBegin, gemmaCallEnd, "<escape>"}
	}
	return nil
}

// DetectFormat picks the tool-call format a chat template's source teaches its
// model, by the special marks it writes. NewTemplate prefers what the template
// renders for a call (FormatOfRendering) and falls back to this.
func DetectFormat(src string) Format {
	switch {
	case strings.Contains(src, "<|channel|>"):
		return FormatHarmony
	case strings.Contains(src, "[TOOL_CALLS]"):
		return FormatMistral
	case strings.Contains(src, deepseekSep):
		return FormatDeepSeek
	case strings.Contains(src, kimiArgBegin):
		return FormatKimi
	case strings.Contains(src, gemmaCallBegin):
		return FormatFunctionGemma
	case strings.Contains(src, "<tool_call>") && strings.Contains(src, "<function="):
		return FormatQwen3Coder
	case strings.Contains(src, "<tool_call>") && strings.Contains(src, "<arg_key>"):
		return FormatGLM
	case strings.Contains(src, "<tool_call>"):
		return FormatHermes
	case strings.Contains(src, "<|python_tag|>") || strings.Contains(src, "<|start_header_id|>") && strings.Contains(src, "tool"):
		return FormatLlama3
	}
	return FormatNone
}

// NewCallID returns an OpenAI-style tool call id.
func NewCallID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var b [24]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "call_" + string(b[:])
}

// callJSON decodes one call object: a name and its arguments under "arguments" or
// "parameters" (an object, or a string holding one).
func callJSON(raw []byte) (name, args string, ok bool) {
	var c struct {
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
		Function   *struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return "", "", false
	}
	a := c.Arguments
	if len(a) == 0 {
		a = c.Parameters
	}
	if c.Name == "" && c.Function != nil {
		c.Name, a = c.Function.Name, c.Function.Arguments
	}
	if c.Name == "" {
		return "", "", false
	}
	args, ok = argumentString(a)
	return c.Name, args, ok
}

// argumentString normalises arguments to a compact JSON object string.
func argumentString(a json.RawMessage) (string, bool) {
	a = bytes.TrimSpace(a)
	if len(a) == 0 || bytes.Equal(a, []byte("null")) {
		return "{}", true
	}
	if a[0] == '"' { // arguments sent as a string holding JSON
		var s string
		if json.Unmarshal(a, &s) != nil {
			return "", false
		}
		a = []byte(strings.TrimSpace(s))
	}
	var buf bytes.Buffer
	if json.Compact(&buf, a) != nil || buf.Len() == 0 || buf.Bytes()[0] != '{' {
		return "", false
	}
	return buf.String(), true
}

// parseCalls parses the text of a call region in format f into its calls. It returns
// nil when the text is not well-formed calls, so the caller keeps it as content.
// With atEnd (the output ended inside the region, as when max_tokens cuts it), a last
// call that the end cut short is left out and cut is true: calls are the complete
// ones before it, maybe none.
// tools type the values of formats that write them as text.
func parseCalls(f Format, text string, atEnd bool, tools []api.Tool) (calls []runnerapi.ToolCall, cut bool) {
	calls, cut = decodeCalls(f, text, atEnd, tools)
	for i := range calls {
		name := strings.TrimSpace(calls[i].Function.Name)
		if name == "" {
			return nil, false // a blank name, as in <function= >, names no tool: not a call
		}
		calls[i].Function.Name = name
	}
	return calls, cut
}

// decodeCalls is parseCalls before the names are checked.
func decodeCalls(f Format, text string, atEnd bool, tools []api.Tool) (calls []runnerapi.ToolCall, cut bool) {
	text = strings.TrimSpace(text)
	var out []runnerapi.ToolCall
	add := func(name, args string) {
		out = append(out, runnerapi.ToolCall{ID: NewCallID(), Type: "function",
			Function: runnerapi.FunctionCall{Name: name, Arguments: args}})
	}
	if decode := decoderFor(f, text); decode != nil {
		raw, cut := decode(text, atEnd, tools)
		for _, c := range raw {
			add(c.name, c.args)
		}
		return out, cut
	}
	switch f {
	case FormatMistral:
		text = strings.TrimSpace(strings.TrimPrefix(text, "[TOOL_CALLS]"))
		if strings.HasPrefix(text, "[") { // a JSON array of calls
			dec := json.NewDecoder(strings.NewReader(text))
			_, _ = dec.Token() // [
			for dec.More() {
				var raw json.RawMessage
				if err := dec.Decode(&raw); err != nil {
					return ifCut(out, atEnd && endedEarly(err))
				}
				name, args, ok := callJSON(raw)
				if !ok {
					return nil, false
				}
				add(name, args)
			}
			if _, err := dec.Token(); err != nil { // ]
				return ifCut(out, atEnd && endedEarly(err))
			}
			if len(out) == 0 || strings.TrimSpace(text[dec.InputOffset():]) != "" {
				return nil, false
			}
			return out, false
		}
		// name[ARGS]{...} repeated, each after its own [TOOL_CALLS].
		parts := strings.Split(text, "[TOOL_CALLS]")
		for k, part := range parts {
			last := atEnd && k == len(parts)-1
			name, rest, ok := strings.Cut(strings.TrimSpace(part), "[ARGS]")
			name = strings.TrimSpace(name)
			if i := strings.Index(name, "[CALL_ID]"); i >= 0 {
				name = strings.TrimSpace(name[:i])
			}
			if !ok || name == "" {
				// The end may cut a call in its name, before [ARGS].
				return ifCut(out, last && !ok && !strings.ContainsAny(name, " \t\r\n"))
			}
			args, ok := argumentString(json.RawMessage(rest))
			if !ok {
				return ifCut(out, last && jsonCut(rest))
			}
			add(name, args)
		}
		return out, false
	default: // one or more JSON objects, separated by ";" or whitespace
		text = strings.TrimSpace(strings.TrimPrefix(text, "<|python_tag|>"))
		for {
			dec := json.NewDecoder(strings.NewReader(text))
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return ifCut(out, atEnd && strings.HasPrefix(text, "{") && endedEarly(err))
			}
			name, args, ok := callJSON(raw)
			if !ok {
				return nil, false
			}
			add(name, args)
			text = strings.TrimLeft(text[dec.InputOffset():], " \t\r\n;")
			if text == "" {
				return out, false
			}
		}
	}
}

// ifCut is what parseCalls returns when a call does not parse: the complete calls
// before it when the end cut it, else nothing (the region is content).
func ifCut(complete []runnerapi.ToolCall, cut bool) ([]runnerapi.ToolCall, bool) {
	if !cut {
		return nil, false
	}
	return complete, true
}

// endedEarly reports whether a JSON decoding error is the input ending inside a value.
func endedEarly(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// jsonCut reports whether s is the beginning of a JSON object that ends too soon.
func jsonCut(s string) bool {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "{") {
		return false
	}
	var v json.RawMessage
	return endedEarly(json.NewDecoder(strings.NewReader(s)).Decode(&v))
}

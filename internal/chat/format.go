package chat

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"strings"

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
)

var formatNames = map[Format]string{FormatNone: "none", FormatHermes: "hermes", FormatLlama3: "llama3-json",
	FormatMistral: "mistral", FormatHarmony: "harmony"}

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
	}
	return nil
}

// DetectFormat picks the tool-call format a chat template teaches its model.
func DetectFormat(src string) Format {
	switch {
	case strings.Contains(src, "<|channel|>"):
		return FormatHarmony
	case strings.Contains(src, "[TOOL_CALLS]"):
		return FormatMistral
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

// parseCalls parses the text of a call region in format f. It returns nil when the
// text is not a well-formed call, so the caller keeps it as content.
func parseCalls(f Format, text string) []runnerapi.ToolCall {
	text = strings.TrimSpace(text)
	var out []runnerapi.ToolCall
	add := func(name, args string) {
		out = append(out, runnerapi.ToolCall{ID: NewCallID(), Type: "function",
			Function: runnerapi.FunctionCall{Name: name, Arguments: args}})
	}
	switch f {
	case FormatMistral:
		text = strings.TrimSpace(strings.TrimPrefix(text, "[TOOL_CALLS]"))
		if strings.HasPrefix(text, "[") { // a JSON array of calls
			var arr []json.RawMessage
			if json.Unmarshal([]byte(text), &arr) != nil || len(arr) == 0 {
				return nil
			}
			for _, raw := range arr {
				name, args, ok := callJSON(raw)
				if !ok {
					return nil
				}
				add(name, args)
			}
			return out
		}
		// name[ARGS]{...} repeated, each after its own [TOOL_CALLS].
		for _, part := range strings.Split(text, "[TOOL_CALLS]") {
			name, rest, ok := strings.Cut(strings.TrimSpace(part), "[ARGS]")
			name = strings.TrimSpace(name)
			if i := strings.Index(name, "[CALL_ID]"); i >= 0 {
				name = strings.TrimSpace(name[:i])
			}
			if !ok || name == "" {
				return nil
			}
			args, ok := argumentString(json.RawMessage(rest))
			if !ok {
				return nil
			}
			add(name, args)
		}
		return out
	default: // one or more JSON objects, separated by ";" or whitespace
		text = strings.TrimSpace(strings.TrimPrefix(text, "<|python_tag|>"))
		dec := json.NewDecoder(strings.NewReader(text))
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				break
			}
			name, args, ok := callJSON(raw)
			if !ok {
				return nil
			}
			add(name, args)
			rest := strings.TrimLeft(text[dec.InputOffset():], " \t\r\n;")
			if rest == "" {
				return out
			}
			text = rest
			dec = json.NewDecoder(strings.NewReader(text))
		}
		return nil
	}
}

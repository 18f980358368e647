package prefixdigest

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Conversation is a chat request's conversation in the canonical form the digests
// hash, the same whichever of the three chat APIs carried it.
type Conversation struct {
	// System is the head's text: the leading system (or developer) messages, the
	// Anthropic system prompt, the Responses instructions; parts joined by "\n".
	System string
	// Tools are the tools' definitions, in the order sent, each
	// "name\x00description\x00parameters" with the parameters' JSON schema in
	// canonical JSON (keys sorted); a tool that is not a function is its whole
	// definition in canonical JSON.
	Tools []string
	// Messages follow the head, oldest first.
	Messages []Message
}

// Message is one canonical message: a role (system, user, assistant or tool — an
// Anthropic tool_result block and a Responses function_call_output are tool
// messages), its text parts joined by "\n", and an assistant's tool calls. Tool call
// ids are left out: each API spells them its own way.
type Message struct {
	Role      string
	Text      string
	ToolCalls []ToolCall
}

// ToolCall is a call's function name and its arguments in canonical JSON (the raw
// text when it is not JSON, "{}" when empty).
type ToolCall struct {
	Name      string
	Arguments string
}

// request is the union of the three APIs' fields that the conversation is read from.
type request struct {
	Messages     json.RawMessage `json:"messages"`
	System       json.RawMessage `json:"system"`
	Instructions json.RawMessage `json:"instructions"`
	Input        json.RawMessage `json:"input"`
	Tools        []tool          `json:"tools"`
}

type tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	InputSchema json.RawMessage `json:"input_schema"`
	Function    *struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
	raw json.RawMessage
}

func (t *tool) UnmarshalJSON(b []byte) error {
	type plain tool
	if err := json.Unmarshal(b, (*plain)(t)); err != nil {
		return err
	}
	t.raw = append(json.RawMessage(nil), b...)
	return nil
}

// item is a chat message, an Anthropic message or a Responses input item.
type item struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls []struct {
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
	// Responses function_call and function_call_output items.
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// part is a content part: text (chat "text", Responses "input_text"/"output_text",
// Anthropic "text"), an Anthropic tool_use or tool_result block.
type part struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Name    string          `json:"name"`
	Input   json.RawMessage `json:"input"`
	Content json.RawMessage `json:"content"`
}

// Parse reads a chat completions, Responses or Anthropic Messages body into its
// canonical conversation; ok is false for anything else (a text completion, an
// embedding, a body that is not a JSON object).
func Parse(body []byte) (c Conversation, ok bool) {
	var req request
	if json.Unmarshal(body, &req) != nil {
		return Conversation{}, false
	}
	var items []item
	var system []string
	switch {
	case len(req.Messages) > 0:
		if json.Unmarshal(req.Messages, &items) != nil {
			return Conversation{}, false
		}
		system = Texts(req.System)
	case len(req.Instructions) > 0 || len(req.Input) > 0:
		system = Texts(req.Instructions)
		in := bytes.TrimSpace(req.Input)
		if len(in) > 0 && in[0] == '"' {
			items = []item{{Role: "user", Content: in}}
		} else if len(in) > 0 && json.Unmarshal(in, &items) != nil {
			return Conversation{}, false
		}
	default:
		return Conversation{}, false
	}
	for _, t := range req.Tools {
		c.Tools = append(c.Tools, t.canonical())
	}
	head := true
	for _, it := range items {
		role := it.Role
		if role == "developer" {
			role = "system"
		}
		if head && role == "system" && (it.Type == "" || it.Type == "message") {
			system = append(system, Texts(it.Content)...)
			continue
		}
		head = false
		c.Messages = it.appendTo(c.Messages, role)
	}
	c.System = strings.Join(system, "\n")
	return c, true
}

// appendTo adds the canonical messages of one item.
func (it item) appendTo(msgs []Message, role string) []Message {
	switch it.Type {
	case "function_call":
		call := ToolCall{Name: it.Name, Arguments: canonicalArgs(it.Arguments)}
		if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
			msgs[n-1].ToolCalls = append(msgs[n-1].ToolCalls, call)
			return msgs
		}
		return append(msgs, Message{Role: "assistant", ToolCalls: []ToolCall{call}})
	case "function_call_output":
		return append(msgs, Message{Role: "tool", Text: strings.Join(Texts(it.Output), "\n")})
	case "", "message":
	default:
		return msgs // reasoning and other items the prompt does not carry as a message
	}
	m := Message{Role: role}
	var text []string
	var parts []part
	if c := bytes.TrimSpace(it.Content); len(c) > 0 && c[0] == '[' && json.Unmarshal(c, &parts) == nil {
		for _, p := range parts {
			switch p.Type {
			case "tool_use":
				m.ToolCalls = append(m.ToolCalls, ToolCall{Name: p.Name, Arguments: canonicalArgs(p.Input)})
			case "tool_result":
				msgs = append(msgs, Message{Role: "tool", Text: strings.Join(Texts(p.Content), "\n")})
			case "", "text", "input_text", "output_text":
				if p.Text != "" {
					text = append(text, p.Text)
				}
			}
		}
	} else {
		text = Texts(it.Content)
	}
	for _, tc := range it.ToolCalls {
		m.ToolCalls = append(m.ToolCalls, ToolCall{Name: tc.Function.Name, Arguments: canonicalArgs(tc.Function.Arguments)})
	}
	m.Text = strings.Join(text, "\n")
	if m.Text == "" && len(m.ToolCalls) == 0 && len(msgs) > 0 && msgs[len(msgs)-1].Role == "tool" && len(parts) > 0 {
		return msgs // an Anthropic user message of tool results only
	}
	return append(msgs, m)
}

// canonical is a tool's definition in one form for the three APIs.
func (t tool) canonical() string {
	name, desc, params := t.Name, t.Description, t.Parameters
	switch {
	case t.Function != nil:
		name, desc, params = t.Function.Name, t.Function.Description, t.Function.Parameters
	case len(t.InputSchema) > 0:
		params = t.InputSchema
	case t.Type != "" && t.Type != "function":
		return canonicalJSON(t.raw)
	}
	return name + "\x00" + desc + "\x00" + canonicalJSON(params)
}

// canonicalArgs is a tool call's arguments, a JSON string (chat, Responses) or an
// object (Anthropic), as canonical JSON.
func canonicalArgs(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		raw = []byte(strings.TrimSpace(s))
		if len(raw) == 0 {
			return "{}"
		}
		if !json.Valid(raw) {
			return s
		}
	}
	if len(raw) == 0 || string(raw) == "null" {
		return "{}"
	}
	return canonicalJSON(raw)
}

// canonicalJSON re-encodes raw with object keys sorted and no insignificant space;
// raw itself when it is not JSON, "" when empty.
func canonicalJSON(raw json.RawMessage) string {
	if len(bytes.TrimSpace(raw)) == 0 {
		return ""
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return string(raw)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return string(raw)
	}
	return string(b)
}

// Texts reads a string, an array of strings, or an array of content parts with
// "text" (the gateway's prefix affinity reads prompts the same way).
func Texts(raw json.RawMessage) []string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return []string{s}
		}
	case '[':
		var parts []json.RawMessage
		if json.Unmarshal(raw, &parts) != nil {
			return nil
		}
		var out []string
		for _, p := range parts {
			var s string
			if json.Unmarshal(p, &s) == nil {
				out = append(out, s)
				continue
			}
			var pt part
			if json.Unmarshal(p, &pt) == nil && pt.Text != "" {
				out = append(out, pt.Text)
			}
		}
		return out
	}
	return nil
}

package translate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/compat"
)

// MessagesRequest is the body of POST /v1/messages (Anthropic Messages API).
type MessagesRequest struct {
	Model         string             `json:"model"`
	MaxTokens     *int               `json:"max_tokens"`
	Messages      []AnthropicMessage `json:"messages"`
	System        json.RawMessage    `json:"system,omitempty"`
	StopSequences []string           `json:"stop_sequences,omitempty"`
	Temperature   *float64           `json:"temperature,omitempty"`
	TopP          *float64           `json:"top_p,omitempty"`
	TopK          *int               `json:"top_k,omitempty"`
	Stream        bool               `json:"stream,omitempty"`
	// Tools are client tools (decoded strictly as AnthropicTool) and server tools
	// (compat.HostedAnthropicTool), whose other fields are not read.
	Tools      []json.RawMessage    `json:"tools,omitempty"`
	ToolChoice *AnthropicToolChoice `json:"tool_choice,omitempty"`
	Metadata   *struct {
		UserID string `json:"user_id,omitempty"`
	} `json:"metadata,omitempty"`
	Thinking     *AnthropicThinking `json:"thinking,omitempty"`
	OutputConfig *struct {
		Effort string          `json:"effort,omitempty"`
		Format json.RawMessage `json:"format,omitempty"`
	} `json:"output_config,omitempty"`
	// Hints (compat.Messages): accepted, reported in compat.IgnoredHintsHeader.
	ServiceTier       string          `json:"service_tier,omitempty"`
	ContextManagement json.RawMessage `json:"context_management,omitempty"`
	CacheControl      json.RawMessage `json:"cache_control,omitempty"`
}

// AnthropicToolChoice is the request's tool_choice.
type AnthropicToolChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name,omitempty"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use,omitempty"`
}

// AnthropicMessage is one message: its content a string or a list of blocks.
type AnthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// AnthropicTool is a client tool; each field has a row "tools[].NAME" in
// compat.Messages.
type AnthropicTool struct {
	Type         string          `json:"type,omitempty"`
	Name         string          `json:"name"`
	Description  string          `json:"description,omitempty"`
	InputSchema  json.RawMessage `json:"input_schema"`
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
	// Strict asks that the input validate against input_schema: honoured by a grammar
	// of the calls, as chat's function.strict.
	Strict *bool `json:"strict,omitempty"`
	// InputExamples are example inputs, rendered into the description.
	InputExamples []json.RawMessage `json:"input_examples,omitempty"`
	// Hints: the tool is shown to the model at once (no tool search), its input
	// comes whole, and only "direct" callers are served.
	DeferLoading        *bool    `json:"defer_loading,omitempty"`
	EagerInputStreaming *bool    `json:"eager_input_streaming,omitempty"`
	AllowedCallers      []string `json:"allowed_callers,omitempty"`
}

// AnthropicThinking is the request's thinking; each field has a row "thinking.NAME"
// in compat.Messages.
type AnthropicThinking struct {
	Type         string `json:"type"`
	BudgetTokens int    `json:"budget_tokens,omitempty"`
	// Display is a hint: thinking comes back whole, never summarized or omitted.
	Display string `json:"display,omitempty"`
}

// block is a content block of a request (the fields of every kind served).
type block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
	Thinking  string          `json:"thinking"`
	Signature string          `json:"signature"`
	Data      string          `json:"data"`
	Citations json.RawMessage `json:"citations"`
	Cache     json.RawMessage `json:"cache_control"`
	// Source is an image block's source.
	Source json.RawMessage `json:"source"`
}

// blocks reads a string or a list of content blocks.
func blocks(raw json.RawMessage, param string) ([]block, *chatError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == '"' {
		var s string
		if len(raw) > 0 && json.Unmarshal(raw, &s) != nil {
			return nil, invalid(param, "content must be a string or a list of content blocks")
		}
		return []block{{Type: "text", Text: s}}, nil
	}
	var out []block
	if e := decodeStrict(raw, &out, nil, param); e != nil {
		if e.Code == runnerapi.CodeUnknownParameter {
			return nil, e
		}
		return nil, invalid(param, "content must be a string or a list of content blocks: %s", e.Message)
	}
	return out, nil
}

// textOf joins the text blocks of a tool result or system prompt.
func textOf(bs []block, param string) (string, *chatError) {
	var sb strings.Builder
	for i, b := range bs {
		if b.Type != "text" {
			return "", unsupported(fmt.Sprintf("%s[%d].type", param, i), "only text blocks are supported here, got %q", b.Type)
		}
		sb.WriteString(b.Text)
	}
	return sb.String(), nil
}

// chatFromMessages translates a Messages request into a chat completion request, and
// names the hints it accepted without effect below the top level (cache_control, the
// server tools it dropped).
func chatFromMessages(m *MessagesRequest) (map[string]any, []string, *chatError) {
	if m.MaxTokens == nil {
		return nil, nil, invalid("max_tokens", "max_tokens is required")
	}
	return chatFromMessagesBody(m, *m.MaxTokens)
}

// chatFromMessagesBody is chatFromMessages with the answer's token cap given
// (count_tokens has none).
func chatFromMessagesBody(m *MessagesRequest, maxTokens int) (map[string]any, []string, *chatError) {
	if len(m.Messages) == 0 {
		return nil, nil, invalid("messages", "messages must not be empty")
	}
	c := conversation{cached: len(m.CacheControl) > 0}
	if len(m.System) > 0 {
		if e := c.addSystem(m.System, "system"); e != nil {
			return nil, nil, e
		}
	}
	for i, msg := range m.Messages {
		if e := c.addMessage(msg, fmt.Sprintf("messages[%d]", i)); e != nil {
			return nil, nil, e
		}
	}
	msgs := c.msgs
	if len(c.system) > 0 {
		msgs = append([]runnerapi.Message{{Role: "system", Content: runnerapi.MessageContent(strings.Join(c.system, "\n\n"))}}, msgs...)
	}
	if len(msgs) == 0 {
		return nil, nil, invalid("messages", "messages must hold a user or assistant message")
	}
	chat := map[string]any{"model": m.Model, "messages": msgs, "max_tokens": maxTokens, "stream": m.Stream}
	if m.Stream {
		chat["stream_options"] = map[string]any{"include_usage": true}
	}
	if len(m.StopSequences) > 0 {
		chat["stop"] = m.StopSequences
	}
	if m.Temperature != nil {
		if *m.Temperature < 0 || *m.Temperature > 1 {
			return nil, nil, invalid("temperature", "temperature must be between 0 and 1, got %g", *m.Temperature)
		}
		chat["temperature"] = *m.Temperature
	}
	if m.TopP != nil {
		chat["top_p"] = *m.TopP
	}
	if m.TopK != nil {
		chat["top_k"] = *m.TopK
	}
	if m.Metadata != nil && m.Metadata.UserID != "" {
		chat["user"] = m.Metadata.UserID
	}
	tools, hints, e := c.tools(m.Tools, m.ToolChoice)
	if e != nil {
		return nil, nil, e
	}
	if len(tools) > 0 {
		chat["tools"] = tools
	}
	if e := toolChoice(m, chat); e != nil {
		return nil, nil, e
	}
	if e := thinking(m, chat); e != nil {
		return nil, nil, e
	}
	if t := m.Thinking; t != nil {
		if v, _ := json.Marshal(t.Display); compat.Messages.Ignored("thinking.display", v) {
			hints = append(hints, "thinking.display")
		}
	}
	if c.cached {
		hints = append(hints, "cache_control")
	}
	return chat, hints, nil
}

// conversation is a Messages request's conversation in chat terms, as it is read.
type conversation struct {
	msgs []runnerapi.Message
	// system collects the system prompt: the system field, then every system-role
	// message in order (templates take one system message, first).
	system []string
	// cached: some part of the request asked for cache_control.
	cached bool
}

// addSystem adds the text of raw (named param in errors) to the system prompt.
func (c *conversation) addSystem(raw json.RawMessage, param string) *chatError {
	bs, e := blocks(raw, param)
	if e != nil {
		return e
	}
	return c.addSystemBlocks(bs, param)
}

func (c *conversation) addSystemBlocks(bs []block, param string) *chatError {
	text, e := textOf(bs, param)
	if e != nil {
		return e
	}
	c.cached = c.cached || anyCache(bs)
	if text != "" {
		c.system = append(c.system, text)
	}
	return nil
}

// addMessage adds message msg (named param in errors): a system message to the system
// prompt, a user or assistant message as one chat message after the tool results it
// holds.
func (c *conversation) addMessage(msg AnthropicMessage, param string) *chatError {
	if msg.Role != "user" && msg.Role != "assistant" && msg.Role != "system" {
		return invalid(param+".role", "role must be user, assistant or system, got %q", msg.Role)
	}
	bs, e := blocks(msg.Content, param+".content")
	if e != nil {
		return e
	}
	if msg.Role == "system" {
		return c.addSystemBlocks(bs, param+".content")
	}
	c.cached = c.cached || anyCache(bs)
	out := runnerapi.Message{Role: msg.Role}
	var body content
	for j, b := range bs {
		if e := c.addBlock(&out, &body, b, fmt.Sprintf("%s.content[%d]", param, j)); e != nil {
			return e
		}
	}
	if body.text.Len() > 0 || len(body.images) > 0 || len(out.ToolCalls) > 0 || out.ReasoningContent != "" {
		out.Content, out.Images = runnerapi.MessageContent(body.text.String()), body.images
		c.msgs = append(c.msgs, out)
	}
	return nil
}

// addBlock adds block b (named bp in errors) of message out: text and a user's image
// to body, a tool call or reasoning to out, a tool result as a tool message of its own.
func (c *conversation) addBlock(out *runnerapi.Message, body *content, b block, bp string) *chatError {
	switch role := out.Role; {
	case b.Type == "text":
		body.addText(b.Text)
	case b.Type == "image" && role == "user":
		img, e := anthropicImage(b.Source, bp+".source")
		if e != nil {
			return e
		}
		body.addImage(img)
	case b.Type == "tool_use" && role == "assistant":
		input := bytes.TrimSpace(b.Input)
		if len(input) == 0 {
			input = []byte("{}")
		}
		out.ToolCalls = append(out.ToolCalls, runnerapi.ToolCall{ID: b.ID, Type: "function",
			Function: runnerapi.FunctionCall{Name: b.Name, Arguments: string(input)}})
	case b.Type == "thinking" && role == "assistant":
		out.ReasoningContent += b.Thinking
	case b.Type == "redacted_thinking" && role == "assistant":
	case b.Type == "tool_result" && role == "user":
		rb, e := blocks(b.Content, bp+".content")
		if e != nil {
			return e
		}
		c.cached = c.cached || anyCache(rb)
		result, e := textOf(rb, bp+".content")
		if e != nil {
			return e
		}
		if b.IsError {
			result = "Error: " + result
		}
		c.msgs = append(c.msgs, runnerapi.Message{Role: "tool", ToolCallID: b.ToolUseID, Content: runnerapi.MessageContent(result)})
	default:
		return unsupported(bp+".type", "a %q block in a %s message is not supported: text, tool and thinking blocks are, and images in user messages", b.Type, role)
	}
	return nil
}

// tools is the chat function tools of the request's client tools; the server tools
// are dropped and named in the hints, as are the client tools' hint fields.
func (c *conversation) tools(ts []json.RawMessage, choice *AnthropicToolChoice) ([]runnerapi.Tool, []string, *chatError) {
	var tools []runnerapi.Tool
	var hints []string
	for i, raw := range ts {
		param := fmt.Sprintf("tools[%d]", i)
		var head struct {
			Type         string          `json:"type"`
			CacheControl json.RawMessage `json:"cache_control"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return nil, nil, invalid(param, "a tool must be an object with a string type, if any: %v", err)
		}
		c.cached = c.cached || len(head.CacheControl) > 0
		switch {
		case compat.HostedAnthropicTool(head.Type):
			hints = append(hints, "tools["+head.Type+"]")
			continue
		case head.Type != "" && head.Type != "custom":
			return nil, nil, unsupported(param+".type",
				"the Anthropic-defined tool %q is not supported: define a client tool with input_schema", head.Type)
		}
		var t AnthropicTool
		if e := decodeStrict(raw, &t, nil, param); e != nil {
			return nil, nil, e
		}
		for _, h := range []struct {
			name  string
			value any
		}{{"tools[].defer_loading", t.DeferLoading}, {"tools[].eager_input_streaming", t.EagerInputStreaming},
			{"tools[].allowed_callers", t.AllowedCallers}} {
			if v, _ := json.Marshal(h.value); compat.Messages.Ignored(h.name, v) {
				hints = append(hints, h.name)
			}
		}
		if len(t.AllowedCallers) > 0 && !slices.Contains(t.AllowedCallers, "direct") {
			// Only code execution may call it, and that is not served: the model
			// could not call it as the client allows.
			continue
		}
		desc, e := withExamples(t.Description, t.InputExamples, param+".input_examples")
		if e != nil {
			return nil, nil, e
		}
		tools = append(tools, runnerapi.Tool{Type: "function", Function: runnerapi.Function{Name: t.Name, Description: desc,
			Parameters: t.InputSchema, Strict: t.Strict}})
	}
	return tools, hints, nil
}

// withExamples is a tool's description with its input examples (named param in
// errors) after it, one JSON object a line. They are rendered rather than taken as a
// hint: like the description they tell the model how to call the tool, which is
// what the client sends them for (a model calls a tool with an intricate schema better
// for them), and they cost only the prompt tokens the client chose to spend, as they
// do on Anthropic's API.
func withExamples(desc string, examples []json.RawMessage, param string) (string, *chatError) {
	if len(examples) == 0 {
		return desc, nil
	}
	var sb strings.Builder
	sb.WriteString(desc)
	if desc != "" {
		sb.WriteString("\n\n")
	}
	sb.WriteString("Example inputs:")
	for j, ex := range examples {
		var buf bytes.Buffer
		if json.Compact(&buf, ex) != nil || buf.Len() == 0 || buf.Bytes()[0] != '{' {
			return "", invalid(fmt.Sprintf("%s[%d]", param, j), "an input example must be a JSON object")
		}
		sb.WriteString("\n")
		sb.Write(buf.Bytes())
	}
	return sb.String(), nil
}

// toolChoice sets the chat tool_choice (and parallel_tool_calls) of the request's.
func toolChoice(m *MessagesRequest, chat map[string]any) *chatError {
	c := m.ToolChoice
	if c == nil {
		return nil
	}
	switch c.Type {
	case "auto":
		chat["tool_choice"] = "auto"
	case "any":
		chat["tool_choice"] = "required"
	case "none":
		chat["tool_choice"] = "none"
	case "tool":
		chat["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": c.Name}}
	default:
		return invalid("tool_choice.type", "tool_choice type must be auto, any, tool or none, got %q", c.Type)
	}
	if c.DisableParallelToolUse {
		chat["parallel_tool_calls"] = false
	}
	return nil
}

// Anthropic serves POST /v1/messages over a chat completions handler.
func Anthropic(chat http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, chatReq, ok := readMessages(w, r, chatFromMessages)
		if !ok {
			return
		}
		resume, resumed := resumeOf(r)
		resumed = resumed && req.Stream
		if resumed {
			keepOpenMessage(chatReq, req.Messages)
		}
		b, _ := json.Marshal(chatReq)
		var out sink = &anthropicWhole{w: w}
		if req.Stream {
			as := &anthropicStream{w: w, sse: newSSE(w), model: req.Model}
			if resumed {
				as.resume(resume, openReasoning(chatReq))
			}
			out = as
		}
		serveChat(chat, r, b, out)
	})
}

// readMessages reads and decodes a Messages request, translates it with toChat and
// names its hints in the response header; on an error it answers the Anthropic error
// and returns ok false.
func readMessages(w http.ResponseWriter, r *http.Request,
	toChat func(*MessagesRequest) (map[string]any, []string, *chatError)) (req *MessagesRequest, chatReq map[string]any, ok bool) {
	req = &MessagesRequest{}
	body, e := readBody(w, r)
	if e == nil {
		e = decodeStrict(body, req, &compat.Messages, "")
	}
	var hints []string
	if e == nil {
		chatReq, hints, e = toChat(req)
	}
	if e != nil {
		anthropicError(w, e)
		return nil, nil, false
	}
	setHints(w, append(compat.Messages.Hints(body), hints...))
	return req, chatReq, true
}

// anthropicErrorType maps an HTTP status to Anthropic's error type.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, http.StatusInsufficientStorage, 529:
		return "overloaded_error"
	}
	return "api_error"
}

func anthropicErrorBody(e *chatError) map[string]any {
	msg := e.Message
	if e.Param != "" && !strings.Contains(msg, e.Param) {
		msg = e.Param + ": " + msg
	}
	return map[string]any{"type": "error", "error": map[string]any{"type": anthropicErrorType(e.Status), "message": msg}}
}

// AnthropicErrorBody converts an OpenAI error body with its HTTP status into
// Anthropic's shape; ok is false when body is not an OpenAI error.
func AnthropicErrorBody(status int, body []byte) (out []byte, ok bool) {
	var probe struct {
		Type  string          `json:"type"`
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &probe) != nil || probe.Type == "error" || len(probe.Error) == 0 {
		return nil, false
	}
	out, _ = json.Marshal(anthropicErrorBody(parseError(status, body)))
	return out, true
}

func anthropicError(w http.ResponseWriter, e *chatError) {
	writeJSON(w, e.Status, anthropicErrorBody(e))
}

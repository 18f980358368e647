package translate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/compat"
)

// ResponsesRequest is the body of POST /v1/responses (OpenAI Responses API).
type ResponsesRequest struct {
	Model        string          `json:"model"`
	Input        json.RawMessage `json:"input"`
	Instructions *string         `json:"instructions,omitempty"`
	// Tools are function and namespace tools (decoded strictly as ResponsesTool) and
	// hosted tools (dropped whatever their fields).
	Tools             []json.RawMessage `json:"tools,omitempty"`
	ToolChoice        json.RawMessage   `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool             `json:"parallel_tool_calls,omitempty"`
	Text              *struct {
		Format    json.RawMessage `json:"format,omitempty"`
		Verbosity string          `json:"verbosity,omitempty"`
	} `json:"text,omitempty"`
	MaxOutputTokens *int     `json:"max_output_tokens,omitempty"`
	Temperature     *float64 `json:"temperature,omitempty"`
	TopP            *float64 `json:"top_p,omitempty"`
	Stream          bool     `json:"stream,omitempty"`
	Reasoning       *struct {
		Effort  string `json:"effort,omitempty"`
		Summary string `json:"summary,omitempty"`
	} `json:"reasoning,omitempty"`
	Metadata           json.RawMessage `json:"metadata,omitempty"`
	User               string          `json:"user,omitempty"`
	Store              *bool           `json:"store,omitempty"`
	PreviousResponseID string          `json:"previous_response_id,omitempty"`
	Truncation         string          `json:"truncation,omitempty"`
	ServiceTier        string          `json:"service_tier,omitempty"`
	Include            []string        `json:"include,omitempty"`
	TopLogprobs        *int            `json:"top_logprobs,omitempty"`
	StreamOptions      json.RawMessage `json:"stream_options,omitempty"`
	Background         *bool           `json:"background,omitempty"`
	Seed               *int64          `json:"seed,omitempty"`
	PromptCacheKey     string          `json:"prompt_cache_key,omitempty"`
	// Hints (compat.Responses): accepted, reported in compat.IgnoredHintsHeader.
	PromptCacheRetention string          `json:"prompt_cache_retention,omitempty"`
	SafetyIdentifier     string          `json:"safety_identifier,omitempty"`
	ClientMetadata       json.RawMessage `json:"client_metadata,omitempty"`
	ContextManagement    json.RawMessage `json:"context_management,omitempty"`
}

// ResponsesTool is a function tool, or a namespace of function tools.
type ResponsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
	// Tools are a namespace's functions.
	Tools []ResponsesTool `json:"tools,omitempty"`
	// DeferLoading asks that the function be shown only once the hosted tool_search
	// finds it; it is shown at once (a hint).
	DeferLoading *bool `json:"defer_loading,omitempty"`
}

// toolName is a function's name as the client defined it: its namespace (if any) and
// its name there.
type toolName struct{ namespace, name string }

// includable are the include items a Responses request may ask for; macfleet adds
// only the output text's logprobs (includeLogprobs), and has none of the others to add
// (compat.Responses).
var includable = []string{"reasoning.encrypted_content", "message.output_text.logprobs", "web_search_call.results",
	"web_search_call.action.sources", "file_search_call.results", "code_interpreter_call.outputs",
	"computer_call_output.output.image_url", "message.input_image.image_url"}

// item is an input item (the fields of every kind served).
type item struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Status    string          `json:"status"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	Summary   json.RawMessage `json:"summary"`
	// Namespace is a function_call's namespace (namespace tools).
	Namespace        string          `json:"namespace"`
	EncryptedContent json.RawMessage `json:"encrypted_content"`
	// Input is a custom_tool_call's input.
	Input string `json:"input"`
}

// partsText joins the text parts of a message's content (a string or a list).
func partsText(raw json.RawMessage, param string) (string, *chatError) {
	c, e := readParts(raw, param, false)
	if e != nil {
		return "", e
	}
	return c.text.String(), nil
}

// readParts reads a message's content (a string or a list of parts): text parts,
// and input_image parts where images is set (a user's message).
func readParts(raw json.RawMessage, param string, images bool) (*content, *chatError) {
	c := &content{}
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		c.addText(s)
		return c, nil
	}
	var parts []struct {
		Type        string          `json:"type"`
		Text        string          `json:"text"`
		Annotations json.RawMessage `json:"annotations"`
		Logprobs    json.RawMessage `json:"logprobs"`
		ImageURL    *string         `json:"image_url"`
		FileID      string          `json:"file_id"`
		Detail      string          `json:"detail"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, invalid(param, "content must be a string or a list of parts")
	}
	for i, p := range parts {
		pp := fmt.Sprintf("%s[%d]", param, i)
		switch {
		case p.Type == "input_text" || p.Type == "output_text" || p.Type == "text":
			c.addText(p.Text)
		case p.Type == "input_image" && images:
			img, e := responsesImage(p.ImageURL, p.FileID, p.Detail, pp)
			if e != nil {
				return nil, e
			}
			c.addImage(img)
		default:
			return nil, unsupported(pp+".type", "a %q part is not supported here: text parts are, and input_image parts in user messages", p.Type)
		}
	}
	return c, nil
}

// translated is a Responses request in chat terms.
type translated struct {
	chat map[string]any
	// hints are the hints accepted without effect below the top level (the hosted
	// tools dropped).
	hints []string
	// names maps the function names the model sees to the client's (namespaced) ones.
	names map[string]toolName
	// custom are the function names the model sees that are custom tools
	// (responses_custom.go).
	custom map[string]bool
}

// chatFromResponses translates a Responses request into a chat completion request.
func chatFromResponses(q *ResponsesRequest) (*translated, *chatError) {
	if e := checkResponsesRequest(q); e != nil {
		return nil, e
	}
	out := &translated{names: map[string]toolName{}, custom: map[string]bool{}}
	tools, e := out.flattenTools(q.Tools)
	if e != nil {
		return nil, e
	}
	flat := map[toolName]string{}
	for f, n := range out.names {
		flat[n] = f
	}
	msgs, e := responsesMessages(q, flat)
	if e != nil {
		return nil, e
	}
	chat := map[string]any{"model": q.Model, "messages": msgs, "stream": q.Stream}
	if q.Stream {
		chat["stream_options"] = map[string]any{"include_usage": true}
	}
	if q.MaxOutputTokens != nil {
		chat["max_completion_tokens"] = *q.MaxOutputTokens
	}
	for k, v := range map[string]any{"temperature": q.Temperature, "top_p": q.TopP, "seed": q.Seed, "parallel_tool_calls": q.ParallelToolCalls} {
		if !isNil(v) {
			chat[k] = v
		}
	}
	if q.User != "" {
		chat["user"] = q.User
	}
	if q.Reasoning != nil && q.Reasoning.Effort != "" {
		chat["reasoning_effort"] = q.Reasoning.Effort
	}
	// Nested hints: reasoning comes back whole as reasoning_text, never summarized;
	// verbosity is not passed to the model.
	if q.Reasoning != nil && q.Reasoning.Summary != "" && q.Reasoning.Summary != "none" {
		out.hints = append(out.hints, "reasoning.summary")
	}
	if q.Text != nil && q.Text.Verbosity != "" && q.Text.Verbosity != "medium" {
		out.hints = append(out.hints, "text.verbosity")
	}
	out.hints = logprobsFields(q, chat, out.hints)
	if len(tools) > 0 {
		chat["tools"] = tools
	}
	if q.PromptCacheKey != "" {
		chat["prompt_cache_key"] = q.PromptCacheKey
	}
	if tc := bytes.TrimSpace(q.ToolChoice); len(tc) > 0 {
		if chat["tool_choice"], e = responsesToolChoice(tc, flat); e != nil {
			return nil, e
		}
	}
	if q.Text != nil && len(q.Text.Format) > 0 {
		if chat["response_format"], e = responsesFormat(q.Text.Format); e != nil {
			return nil, e
		}
	}
	out.chat = chat
	return out, nil
}

// checkResponsesRequest refuses what a Responses request may ask that is not served.
func checkResponsesRequest(q *ResponsesRequest) *chatError {
	switch {
	case q.PreviousResponseID != "":
		return unsupported("previous_response_id",
			"responses are not stored, so previous_response_id cannot be followed: send the whole conversation as input")
	case q.Background != nil && *q.Background:
		return unsupported("background", "background responses are not supported")
	case q.Truncation != "" && q.Truncation != "disabled":
		return unsupported("truncation", "truncation %q is not supported", q.Truncation)
	}
	for i, inc := range q.Include {
		if !slices.Contains(includable, inc) {
			return invalid(fmt.Sprintf("include[%d]", i), "include must be one of %s, got %q", strings.Join(includable, ", "), inc)
		}
	}
	return nil
}

// responsesMessages is the conversation of a Responses request: its instructions as
// the system message, then its input (a string, or a list of items); flat maps the
// client's tool names to the ones the model sees.
func responsesMessages(q *ResponsesRequest, flat map[toolName]string) ([]runnerapi.Message, *chatError) {
	var msgs []runnerapi.Message
	if q.Instructions != nil && *q.Instructions != "" {
		msgs = append(msgs, runnerapi.Message{Role: "system", Content: runnerapi.MessageContent(*q.Instructions)})
	}
	in := bytes.TrimSpace(q.Input)
	if len(in) == 0 {
		return nil, invalid("input", "input is required")
	}
	if in[0] == '"' {
		var s string
		_ = json.Unmarshal(in, &s)
		return append(msgs, runnerapi.Message{Role: "user", Content: runnerapi.MessageContent(s)}), nil
	}
	var items []item
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&items); err != nil {
		return nil, invalid("input", "input must be a string or a list of items: %v", err)
	}
	for i, it := range items {
		var e *chatError
		if msgs, e = appendInputItem(msgs, it, fmt.Sprintf("input[%d]", i), flat); e != nil {
			return nil, e
		}
	}
	return msgs, nil
}

// appendInputItem appends input item it (named param in errors) to msgs.
func appendInputItem(msgs []runnerapi.Message, it item, param string, flat map[toolName]string) ([]runnerapi.Message, *chatError) {
	switch it.Type { // a custom tool is a function of one string to the model
	case "custom_tool_call":
		it.Type, it.Arguments = "function_call", customArguments(it.Input)
	case "custom_tool_call_output":
		it.Type = "function_call_output"
	}
	switch it.Type {
	case "", "message":
		c, e := readParts(it.Content, param+".content", it.Role == "user")
		if e != nil {
			return nil, e
		}
		text := c.text.String()
		switch it.Role {
		case "user", "system", "developer":
			return append(msgs, runnerapi.Message{Role: it.Role, Content: runnerapi.MessageContent(text), Images: c.images}), nil
		case "assistant":
			return append(msgs, runnerapi.Message{Role: "assistant", Content: runnerapi.MessageContent(text)}), nil
		}
		return nil, invalid(param+".role", "role must be user, assistant, system or developer, got %q", it.Role)
	case "function_call":
		name := it.Name
		if f, ok := flat[toolName{it.Namespace, it.Name}]; ok {
			name = f
		}
		call := runnerapi.ToolCall{ID: it.CallID, Type: "function", Function: runnerapi.FunctionCall{Name: name, Arguments: it.Arguments}}
		// Consecutive calls are one assistant turn.
		if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" && (len(msgs[n-1].ToolCalls) > 0 || msgs[n-1].Content == "") {
			msgs[n-1].ToolCalls = append(msgs[n-1].ToolCalls, call)
			return msgs, nil
		}
		return append(msgs, runnerapi.Message{Role: "assistant", ToolCalls: []runnerapi.ToolCall{call}}), nil
	case "function_call_output":
		var out string
		if json.Unmarshal(it.Output, &out) != nil {
			var e *chatError
			if out, e = partsText(it.Output, param+".output"); e != nil {
				return nil, e
			}
		}
		return append(msgs, runnerapi.Message{Role: "tool", ToolCallID: it.CallID, Content: runnerapi.MessageContent(out)}), nil
	case "reasoning":
		// Past reasoning: templates drop it from earlier turns.
		return msgs, nil
	}
	return nil, unsupported(param+".type", "input items of type %q are not supported", it.Type)
}

// responsesToolChoice is the chat tool_choice of a Responses tool_choice: a mode, or
// a named function (renamed as the model sees it).
func responsesToolChoice(tc json.RawMessage, flat map[toolName]string) (any, *chatError) {
	var mode string
	if json.Unmarshal(tc, &mode) == nil {
		if mode != "none" && mode != "auto" && mode != "required" {
			return nil, invalid("tool_choice", "tool_choice must be none, auto, required or {\"type\":\"function\",\"name\":...}, got %q", mode)
		}
		return mode, nil
	}
	var named struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(tc, &named) != nil || named.Type != "function" && named.Type != "custom" || named.Name == "" {
		return nil, invalid("tool_choice", "tool_choice must be none, auto, required, {\"type\":\"function\",\"name\":...} or {\"type\":\"custom\",\"name\":...}")
	}
	name := named.Name
	if f, ok := flat[toolName{"", named.Name}]; ok {
		name = f
	}
	return map[string]any{"type": "function", "function": map[string]any{"name": name}}, nil
}

// responsesFormat is the chat response_format of a Responses text.format.
func responsesFormat(format json.RawMessage) (any, *chatError) {
	var f struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Schema      json.RawMessage `json:"schema"`
		Strict      *bool           `json:"strict"`
	}
	if err := json.Unmarshal(format, &f); err != nil {
		return nil, invalid("text.format", "text.format must be an object")
	}
	switch f.Type {
	case "text", "json_object":
		return map[string]any{"type": f.Type}, nil
	case "json_schema":
		return map[string]any{"type": "json_schema", "json_schema": map[string]any{
			"name": f.Name, "description": f.Description, "schema": f.Schema, "strict": f.Strict}}, nil
	}
	return nil, invalid("text.format.type", "text.format type must be text, json_object or json_schema, got %q", f.Type)
}

// deferHint names tools[].defer_loading in the hints when the tool or one of its
// namespace's functions asks for it: every function is shown to the model at once.
func (t *translated) deferHint(tool ResponsesTool) {
	for _, f := range append([]ResponsesTool{tool}, tool.Tools...) {
		if v, _ := json.Marshal(f.DeferLoading); compat.Responses.Ignored("tools[].defer_loading", v) {
			t.hints = append(t.hints, "tools[].defer_loading")
			return
		}
	}
}

// flattenTools turns the request's tools into chat function tools: function tools as
// they are, a namespace's functions each on its own (named as in the namespace unless
// that name is taken, then "namespace__name"), hosted tools dropped and named in the
// hints; any other type is refused.
func (t *translated) flattenTools(raw []json.RawMessage) ([]runnerapi.Tool, *chatError) {
	type fn struct {
		tool    ResponsesTool
		name    toolName
		param   string
		grammar *runnerapi.InputGrammar // a custom tool's (custom set)
		custom  bool
	}
	var fns []fn
	for i, r := range raw {
		param := fmt.Sprintf("tools[%d]", i)
		var head struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(r, &head) != nil {
			return nil, invalid(param, "a tool must be an object with a type")
		}
		if compat.HostedResponsesTool(head.Type) {
			t.hints = append(t.hints, "tools["+head.Type+"]")
			continue
		}
		if head.Type == "custom" {
			tool, g, e := t.customFunction(r, param)
			if e != nil {
				return nil, e
			}
			t.deferHint(tool)
			fns = append(fns, fn{tool: tool, name: toolName{"", tool.Name}, param: param, grammar: g, custom: true})
			continue
		}
		if head.Type != "function" && head.Type != "namespace" {
			return nil, unsupported(param+".type", "tools of type %q are not supported: only the vendor's models call them; define function or custom tools", head.Type)
		}
		var tool ResponsesTool
		if e := decodeStrict(r, &tool, nil, param); e != nil {
			return nil, e
		}
		t.deferHint(tool)
		if tool.Type == "function" {
			if len(tool.Tools) > 0 {
				return nil, invalid(param+".tools", "a function tool has no tools")
			}
			fns = append(fns, fn{tool: tool, name: toolName{"", tool.Name}, param: param})
			continue
		}
		for j, inner := range tool.Tools {
			if inner.Type != "function" || len(inner.Tools) > 0 {
				return nil, unsupported(fmt.Sprintf("%s.tools[%d].type", param, j), "a namespace holds function tools, got %q", inner.Type)
			}
			fns = append(fns, fn{tool: inner, name: toolName{tool.Name, inner.Name}, param: fmt.Sprintf("%s.tools[%d]", param, j)})
		}
	}
	count := map[string]int{}
	for _, f := range fns {
		count[f.name.name]++
	}
	var tools []runnerapi.Tool
	for _, f := range fns {
		name := f.name.name
		if f.name.namespace != "" && count[name] > 1 {
			name = f.name.namespace + "__" + name
		}
		if _, dup := t.names[name]; dup {
			return nil, invalid(f.param+".name", "function %q is defined twice", name)
		}
		t.names[name] = f.name
		t.custom[name] = f.custom
		tools = append(tools, runnerapi.Tool{Type: "function", Function: runnerapi.Function{Name: name, Description: f.tool.Description,
			Parameters: f.tool.Parameters, Strict: f.tool.Strict, InputGrammar: f.grammar}})
	}
	return tools, nil
}

func isNil(v any) bool {
	switch p := v.(type) {
	case *float64:
		return p == nil
	case *int64:
		return p == nil
	case *bool:
		return p == nil
	}
	return v == nil
}

// Responses serves POST /v1/responses over a chat completions handler.
func Responses(chat http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, e := readBody(w, r)
		var req ResponsesRequest
		if e == nil {
			e = decodeStrict(body, &req, &compat.Responses, "")
		}
		var tr *translated
		if e == nil {
			tr, e = chatFromResponses(&req)
		}
		if e != nil {
			openAIError(w, e)
			return
		}
		setHints(w, append(compat.Responses.Hints(body), tr.hints...))
		resume, resumed := resumeOf(r)
		resumed = resumed && req.Stream
		if resumed && resume.Reasoning != "" {
			resumedReasoning(tr.chat, req.Input)
		}
		b, _ := json.Marshal(tr.chat)
		rs := &responseState{w: w, req: &req, names: tr.names, custom: tr.custom, created: time.Now().Unix()}
		if req.Stream {
			rs.sse = newSSE(w)
		}
		if resumed {
			rs.resume(resume, continuedText(tr.chat), continuedReasoning(tr.chat))
			if rs.open == "message" {
				rs.lps = resumedLogprobs(req.Input)
			}
		}
		serveChat(chat, r, b, rs)
	})
}

func openAIError(w http.ResponseWriter, e *chatError) {
	var param any
	if e.Param != "" {
		param = e.Param
	}
	var code any
	if e.Code != "" {
		code = e.Code
	}
	writeJSON(w, e.Status, map[string]any{"error": map[string]any{"message": e.Message, "type": e.Type, "param": param, "code": code}})
}

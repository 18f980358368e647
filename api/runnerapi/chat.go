package runnerapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Error codes for request fields.
const (
	// CodeUnknownParameter is a field that is not part of the API.
	CodeUnknownParameter = "unknown_parameter"
	// CodeUnsupportedParameter is a field of the API that macfleet does not serve
	// (yet), or a value of it that it does not.
	CodeUnsupportedParameter = "unsupported_parameter"
	// CodeTemplateError is a conversation the model's chat template refuses or fails
	// to render.
	CodeTemplateError = "chat_template_error"
)

// ToolCall is a function call of an assistant message (request history or response).
type ToolCall struct {
	// Index is the call's position, sent only in stream deltas.
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"` // function
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and carries its arguments as a JSON string.
type FunctionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
	// ParsedArguments is what the official SDKs' stream helpers add to a call they
	// hand back; it is derived from the arguments and ignored.
	ParsedArguments json.RawMessage `json:"parsed_arguments,omitempty"`
}

// Tool is a tool the model may call.
type Tool struct {
	Type     string   `json:"type"`
	Function Function `json:"function"`
}

// Function describes a callable function: its parameters are a JSON schema.
type Function struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
	// InputGrammar makes the function a freeform tool's (inputgrammar.go).
	InputGrammar *InputGrammar `json:"input_grammar,omitempty"`
}

// ToolChoice is "none", "auto", "required" or a named function.
type ToolChoice struct {
	Mode     string // none, auto, required, function
	Function string // with Mode function
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *ToolChoice) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		switch s {
		case "none", "auto", "required":
			c.Mode = s
			return nil
		}
		return fmt.Errorf("tool_choice must be none, auto, required or {\"type\":\"function\",\"function\":{\"name\":...}}, got %q", s)
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(b, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
		return fmt.Errorf("tool_choice must be none, auto, required or {\"type\":\"function\",\"function\":{\"name\":...}}")
	}
	c.Mode, c.Function = "function", named.Function.Name
	return nil
}

// ChatTools are the tool fields of a chat request.
type ChatTools struct {
	Tools             []Tool      `json:"tools,omitempty"`
	ToolChoice        *ToolChoice `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool       `json:"parallel_tool_calls,omitempty"`
	// Functions and FunctionCall are the deprecated forms of tools and tool_choice.
	Functions    json.RawMessage `json:"functions,omitempty"`
	FunctionCall json.RawMessage `json:"function_call,omitempty"`
}

// Unsupported are OpenAI chat fields macfleet does not act on: the ones refused
// unless neutral (logit_bias, audio, modalities, web_search_options), prediction
// (speculative decoding's drafts: Options.Predicted) and
// the hints accepted whatever their value (store, metadata, service_tier, verbosity,
// safety_identifier, user, prompt_cache_retention; see internal/chat/compat), plus
// prompt_cache_key (the gateway routes by it) and reasoning_effort (the template
// reads it).
type Unsupported struct {
	LogitBias       json.RawMessage `json:"logit_bias,omitempty"`
	Audio           json.RawMessage `json:"audio,omitempty"`
	Modalities      []string        `json:"modalities,omitempty"`
	Prediction      json.RawMessage `json:"prediction,omitempty"`
	WebSearch       json.RawMessage `json:"web_search_options,omitempty"`
	Store           *bool           `json:"store,omitempty"`
	Metadata        json.RawMessage `json:"metadata,omitempty"`
	ServiceTier     string          `json:"service_tier,omitempty"`
	Verbosity       string          `json:"verbosity,omitempty"`
	PromptCacheKey  string          `json:"prompt_cache_key,omitempty"`
	SafetyID        string          `json:"safety_identifier,omitempty"`
	User            string          `json:"user,omitempty"`
	ReasoningEffort string          `json:"reasoning_effort,omitempty"`
	CacheRetention  string          `json:"prompt_cache_retention,omitempty"`
}

func isNull(b json.RawMessage) bool {
	t := bytes.TrimSpace(b)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// Check refuses the fields whose value macfleet cannot honour.
func (u Unsupported) Check() *Error {
	unsupported := func(param, format string, args ...any) *Error {
		return InvalidRequest(CodeUnsupportedParameter, param, format, args...)
	}
	switch {
	case !isNull(u.LogitBias) && string(bytes.TrimSpace(u.LogitBias)) != "{}":
		return unsupported("logit_bias", "logit_bias is not supported")
	case !isNull(u.Audio):
		return unsupported("audio", "audio output is not supported: the models served are text-only")
	case len(u.Modalities) > 0 && (len(u.Modalities) != 1 || u.Modalities[0] != "text"):
		return unsupported("modalities", "only the text modality is supported, got %v", u.Modalities)
	case !isNull(u.WebSearch):
		return unsupported("web_search_options", "web search is not supported")
	}
	switch u.ReasoningEffort {
	case "", "none", "minimal", "low", "medium", "high":
	default:
		return InvalidRequest(CodeInvalidValue, "reasoning_effort", "reasoning_effort must be none, minimal, low, medium or high, got %q", u.ReasoningEffort)
	}
	return nil
}

// CheckTools validates the tool fields against each other.
func (t ChatTools) CheckTools() *Error {
	switch {
	case !isNull(t.Functions):
		return InvalidRequest(CodeUnsupportedParameter, "functions", "functions is deprecated and not supported: send tools instead")
	case !isNull(t.FunctionCall):
		return InvalidRequest(CodeUnsupportedParameter, "function_call", "function_call is deprecated and not supported: send tool_choice instead")
	case len(t.Tools) > MaxTools:
		return InvalidRequest(CodeInvalidValue, "tools", "at most %d tools are allowed, got %d", MaxTools, len(t.Tools))
	}
	names := map[string]bool{}
	for i, tool := range t.Tools {
		param := fmt.Sprintf("tools[%d]", i)
		switch {
		case tool.Type != "function":
			return InvalidRequest(CodeInvalidValue, param+".type", "tool type must be \"function\", got %q", tool.Type)
		case !validFunctionName(tool.Function.Name):
			return InvalidRequest(CodeInvalidValue, param+".function.name",
				"function names are 1 to 64 letters, digits, underscores and dashes, got %q", tool.Function.Name)
		case names[tool.Function.Name]:
			return InvalidRequest(CodeInvalidValue, param+".function.name", "function %q is defined twice", tool.Function.Name)
		}
		names[tool.Function.Name] = true
		if p := bytes.TrimSpace(tool.Function.Parameters); len(p) > 0 && p[0] != '{' && !isNull(p) {
			return InvalidRequest(CodeInvalidValue, param+".function.parameters", "parameters must be a JSON schema object")
		}
	}
	forced := t.Forced()
	if c := t.ToolChoice; forced {
		if len(t.Tools) == 0 {
			return InvalidRequest(CodeInvalidValue, "tool_choice", "tool_choice %q needs tools", c.Mode)
		}
		if c.Mode == "function" && !names[c.Function] {
			return InvalidRequest(CodeInvalidValue, "tool_choice", "tool_choice names function %q, which is not among the tools", c.Function)
		}
	}
	return nil
}

// Forced reports whether the model must call a tool: tool_choice "required" or a
// named function.
func (t ChatTools) Forced() bool {
	return t.ToolChoice != nil && (t.ToolChoice.Mode == "required" || t.ToolChoice.Mode == "function")
}

// None reports whether tool_choice is "none".
func (t ChatTools) None() bool { return t.ToolChoice != nil && t.ToolChoice.Mode == "none" }

// ResponseFormat is the response_format of a chat request.
type ResponseFormat struct {
	Type       string            `json:"type"` // text, json_object or json_schema
	JSONSchema *JSONSchemaFormat `json:"json_schema,omitempty"`
}

// JSONSchemaFormat is the schema of a json_schema response format. macfleet enforces
// the schema with grammar-constrained sampling whether strict is set or not.
type JSONSchemaFormat struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// Check validates the format's shape (the schema's keywords are checked where the
// grammar is built).
func (f *ResponseFormat) Check() *Error {
	if f == nil {
		return nil
	}
	switch f.Type {
	case "text", "json_object":
		if f.JSONSchema != nil {
			return InvalidRequest(CodeInvalidValue, "response_format.json_schema", "json_schema goes with type \"json_schema\", not %q", f.Type)
		}
		return nil
	case "json_schema":
	default:
		return InvalidRequest(CodeInvalidValue, "response_format.type", "response_format type must be text, json_object or json_schema, got %q", f.Type)
	}
	s := f.JSONSchema
	switch {
	case s == nil:
		return InvalidRequest(CodeMissingField, "response_format.json_schema", "a json_schema response format needs json_schema: {name, schema}")
	case !validFunctionName(s.Name):
		return InvalidRequest(CodeInvalidValue, "response_format.json_schema.name",
			"the schema name is 1 to 64 letters, digits, underscores and dashes, got %q", s.Name)
	case isNull(s.Schema):
		return InvalidRequest(CodeMissingField, "response_format.json_schema.schema", "a json_schema response format needs a schema")
	case bytes.TrimSpace(s.Schema)[0] != '{':
		return InvalidRequest(CodeInvalidValue, "response_format.json_schema.schema", "the schema must be a JSON object")
	}
	return nil
}

// Constrained reports whether the format constrains the output.
func (f *ResponseFormat) Constrained() bool { return f != nil && f.Type != "text" }

// MaxTools bounds the tools of one request.
const MaxTools = 128

func validFunctionName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// unknownField extracts the field name from encoding/json's unknown-field error.
func unknownField(err error) (string, bool) {
	const prefix = "json: unknown field "
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix) {
		return "", false
	}
	return strings.Trim(strings.TrimPrefix(msg, prefix), `"`), true
}

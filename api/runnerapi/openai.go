package runnerapi

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// StringList is a string or an array of strings.
type StringList []string

// UnmarshalJSON implements json.Unmarshaler.
func (l *StringList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*l = nil
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*l = StringList{s}
		return nil
	}
	var ss []string
	if err := json.Unmarshal(b, &ss); err != nil {
		return errors.New("must be a string or an array of strings")
	}
	*l = ss
	return nil
}

// Input is an embeddings input or a completions prompt: a string, an array of
// strings, an array of token ids, or an array of token-id arrays. Exactly one of
// Texts and Tokens is set after unmarshalling.
type Input struct {
	Texts  []string
	Tokens [][]int32
}

// UnmarshalJSON implements json.Unmarshaler.
func (in *Input) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	*in = Input{}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		in.Texts = []string{s}
		return nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || len(raw) == 0 {
		return errors.New("must be a string, an array of strings or an array of token ids")
	}
	first := bytes.TrimSpace(raw[0])
	switch {
	case len(first) > 0 && first[0] == '"':
		var ss []string
		if err := json.Unmarshal(b, &ss); err != nil {
			return errors.New("mixes strings with other values")
		}
		in.Texts = ss
	case len(first) > 0 && first[0] == '[':
		var tt [][]int32
		if err := json.Unmarshal(b, &tt); err != nil {
			return errors.New("must be arrays of token ids")
		}
		in.Tokens = tt
	default:
		var t []int32
		if err := json.Unmarshal(b, &t); err != nil {
			return errors.New("must be an array of token ids")
		}
		in.Tokens = [][]int32{t}
	}
	return nil
}

// Len is the number of inputs.
func (in Input) Len() int { return len(in.Texts) + len(in.Tokens) }

// StreamOptions are OpenAI's stream_options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
	// IncludeObfuscation is a hint (internal/chat/compat): events are never padded.
	IncludeObfuscation *bool `json:"include_obfuscation,omitempty"`
}

// Sampling holds the generation fields shared by chat and text completions.
type Sampling struct {
	MaxTokens           *int           `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int           `json:"max_completion_tokens,omitempty"`
	Temperature         *float64       `json:"temperature,omitempty"`
	TopP                *float64       `json:"top_p,omitempty"`
	TopK                *int           `json:"top_k,omitempty"`
	MinP                *float64       `json:"min_p,omitempty"`
	Seed                *int64         `json:"seed,omitempty"`
	Stop                StringList     `json:"stop,omitempty"`
	PresencePenalty     *float64       `json:"presence_penalty,omitempty"`
	FrequencyPenalty    *float64       `json:"frequency_penalty,omitempty"`
	N                   *int           `json:"n,omitempty"`
	Stream              bool           `json:"stream,omitempty"`
	StreamOptions       *StreamOptions `json:"stream_options,omitempty"`
	// CacheSalt (cache_salt, an extension) divides the prompt cache: only requests with the same
	// salt, in the same partition (HeaderCachePartition), share cached prefixes.
	CacheSalt string `json:"cache_salt,omitempty"`
}

// ChatRequest is the body of POST /v1/chat/completions.
type ChatRequest struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	Sampling
	Logprobs    *bool `json:"logprobs,omitempty"`
	TopLogprobs *int  `json:"top_logprobs,omitempty"`
	ChatTools
	ResponseFormat *ResponseFormat `json:"response_format,omitempty"`
	Unsupported
	// ChatTemplateKwargs are extra variables for the model's chat template (e.g.
	// enable_thinking).
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs,omitempty"`
}

// Check validates the fields beyond sampling: tools, the unsupported ones, the
// template variables.
func (r *ChatRequest) Check() *Error {
	if e := r.Unsupported.Check(); e != nil {
		return e
	}
	if e := r.CheckTools(); e != nil {
		return e
	}
	if e := r.ResponseFormat.Check(); e != nil {
		return e
	}
	for k := range r.ChatTemplateKwargs {
		switch k {
		case "messages", "tools", "add_generation_prompt", "bos_token", "eos_token":
			return InvalidRequest(CodeInvalidValue, "chat_template_kwargs", "chat_template_kwargs must not set %q", k)
		}
	}
	for i, m := range r.Messages {
		param := fmt.Sprintf("messages[%d]", i)
		switch {
		case m.Refusal != nil && *m.Refusal != "" && m.Content == "":
			return InvalidRequest(CodeUnsupportedParameter, param+".refusal", "a refusal in the history is not supported: send it as content")
		case !isNull(m.Audio):
			return InvalidRequest(CodeUnsupportedParameter, param+".audio", "audio in messages is not supported")
		case !isNull(m.FunctionCall):
			return InvalidRequest(CodeUnsupportedParameter, param+".function_call", "function_call is deprecated and not supported: send tool_calls")
		case len(m.ToolCalls) > 0 && m.Role != "assistant":
			return InvalidRequest(CodeInvalidValue, param+".tool_calls", "only assistant messages carry tool_calls")
		case m.Role == "tool" && m.ToolCallID == "":
			return InvalidRequest(CodeInvalidValue, param+".tool_call_id", "a tool message needs the tool_call_id it answers")
		}
		for j, c := range m.ToolCalls {
			if c.Function.Name == "" {
				return InvalidRequest(CodeInvalidValue, fmt.Sprintf("%s.tool_calls[%d].function.name", param, j), "a tool call needs a function name")
			}
		}
	}
	return nil
}

// CompletionRequest is the body of POST /v1/completions.
type CompletionRequest struct {
	Model  string `json:"model"`
	Prompt *Input `json:"prompt"`
	Echo   bool   `json:"echo,omitempty"`
	Sampling
	User      string          `json:"user,omitempty"`
	Suffix    *string         `json:"suffix,omitempty"`
	Logprobs  *int            `json:"logprobs,omitempty"`
	BestOf    *int            `json:"best_of,omitempty"`
	LogitBias json.RawMessage `json:"logit_bias,omitempty"`
}

// Check refuses the completion fields macfleet does not serve.
func (r *CompletionRequest) Check() *Error {
	switch {
	case r.Suffix != nil && *r.Suffix != "":
		return InvalidRequest(CodeUnsupportedParameter, "suffix", "suffix (fill in the middle) is not supported")
	case r.Logprobs != nil && (*r.Logprobs < 0 || *r.Logprobs > MaxTopLogprobs):
		return InvalidRequest(CodeInvalidValue, "logprobs", "logprobs must be between 0 and %d, got %d", MaxTopLogprobs, *r.Logprobs)
	case r.BestOf != nil && *r.BestOf != 1:
		return InvalidRequest(CodeUnsupportedParameter, "best_of", "best_of is not supported")
	case !isNull(r.LogitBias) && string(bytes.TrimSpace(r.LogitBias)) != "{}":
		return InvalidRequest(CodeUnsupportedParameter, "logit_bias", "logit_bias is not supported")
	}
	return nil
}

// EmbeddingRequest is the body of POST /v1/embeddings.
type EmbeddingRequest struct {
	Model          string `json:"model"`
	Input          *Input `json:"input"`
	EncodingFormat string `json:"encoding_format,omitempty"`
	Dimensions     *int   `json:"dimensions,omitempty"`
	User           string `json:"user,omitempty"`
}

// Options are validated generation options with OpenAI's defaults filled in.
type Options struct {
	// MaxTokens caps the completion; 0 means until the context is full.
	MaxTokens                         int
	Temperature, TopP, MinP           float32
	TopK                              int
	Seed                              uint32
	SeedSet                           bool
	PresencePenalty, FrequencyPenalty float32
	Stop                              []string
	Stream, IncludeUsage              bool
	// N is the number of choices, each its own sequence (choice i samples with seed
	// Seed+i).
	N int
	// Logprobs asks for each generated token's log-probability and TopLogprobs for
	// that many most likely alternatives (at most MaxTopLogprobs).
	Logprobs    bool
	TopLogprobs int
	// Grammar constrains the output (GBNF, root rule "root"); the runner sets it from
	// response_format, tool_choice and strict tools.
	Grammar string
	// GrammarTriggers make Grammar lazy (strict tools under tool_choice "auto"): it
	// holds once the output matches one of these patterns (grammar.Spec.Triggers).
	GrammarTriggers []string
	// CacheSalt is the request's cache_salt.
	CacheSalt string
	// ContinuedPrompt is how many of the prompt's tokens are an answer the request
	// continues (HeaderContinue): its usage does not count them as prompt tokens.
	// Continued is how many completion tokens that answer counts as: ContinuedPrompt,
	// or what HeaderContinuedTokens says the client was sent.
	ContinuedPrompt, Continued int
	// Predicted is the chat request's prediction (OpenAI's predicted outputs): text
	// the answer is expected to repeat, which speculative decoding drafts from. It
	// changes the speed only, never the answer.
	Predicted string
	// Spent: the continued answer is declared (HeaderContinuedTokens) to have
	// max_tokens tokens already, so it ends at once, finish reason length, generating
	// none.
	Spent bool
}

// Limits of request fields.
const (
	MaxChoices     = 16
	MaxTopLogprobs = 20
	MaxStopStrings = 16
	MaxStopLength  = 256
)

// Options validates the sampling fields and fills in defaults (temperature 1, top_p 1,
// everything else off).
func (s Sampling) Options() (Options, *Error) {
	o := Options{Temperature: 1, TopP: 1, Stream: s.Stream, CacheSalt: s.CacheSalt}
	maxTok := s.MaxCompletionTokens
	param := "max_completion_tokens"
	if maxTok == nil {
		maxTok, param = s.MaxTokens, "max_tokens"
	}
	if maxTok != nil {
		if *maxTok < 1 {
			return o, InvalidRequest(CodeInvalidValue, param, "%s must be at least 1, got %d", param, *maxTok)
		}
		o.MaxTokens = *maxTok
	}
	ranged := func(p *float64, name string, lo, hi float64, dst *float32) *Error {
		if p == nil {
			return nil
		}
		if math.IsNaN(*p) || *p < lo || *p > hi {
			return InvalidRequest(CodeInvalidValue, name, "%s must be between %g and %g, got %g", name, lo, hi, *p)
		}
		*dst = float32(*p)
		return nil
	}
	for _, f := range []struct {
		p      *float64
		name   string
		lo, hi float64
		dst    *float32
	}{
		{s.Temperature, "temperature", 0, 2, &o.Temperature},
		{s.TopP, "top_p", 0, 1, &o.TopP},
		{s.MinP, "min_p", 0, 1, &o.MinP},
		{s.PresencePenalty, "presence_penalty", -2, 2, &o.PresencePenalty},
		{s.FrequencyPenalty, "frequency_penalty", -2, 2, &o.FrequencyPenalty},
	} {
		if err := ranged(f.p, f.name, f.lo, f.hi, f.dst); err != nil {
			return o, err
		}
	}
	if s.TopK != nil {
		if *s.TopK < 0 {
			return o, InvalidRequest(CodeInvalidValue, "top_k", "top_k must not be negative, got %d", *s.TopK)
		}
		o.TopK = *s.TopK
	}
	if s.Seed != nil {
		o.Seed, o.SeedSet = uint32(uint64(*s.Seed)), true
	}
	o.N = 1
	if s.N != nil {
		if *s.N < 1 || *s.N > MaxChoices {
			return o, InvalidRequest(CodeInvalidValue, "n", "n must be between 1 and %d, got %d", MaxChoices, *s.N)
		}
		o.N = *s.N
	}
	if len(s.Stop) > MaxStopStrings {
		return o, InvalidRequest(CodeInvalidValue, "stop", "at most %d stop strings are allowed, got %d", MaxStopStrings, len(s.Stop))
	}
	for _, st := range s.Stop {
		if len(st) > MaxStopLength {
			return o, InvalidRequest(CodeInvalidValue, "stop", "stop strings are limited to %d bytes", MaxStopLength)
		}
		if st != "" {
			o.Stop = append(o.Stop, st)
		}
	}
	if s.StreamOptions != nil {
		if !s.Stream {
			return o, InvalidRequest(CodeInvalidValue, "stream_options", "stream_options is only allowed with stream: true")
		}
		o.IncludeUsage = s.StreamOptions.IncludeUsage
	}
	return o, nil
}

// DecodeJSON parses a request body into v, mapping failures to 400 errors: malformed
// JSON is invalid_json, a well-formed body with a wrong value is invalid_value, a
// field the request type does not have is unknown_parameter (nothing is silently
// dropped).
func DecodeJSON(body []byte, v any) *Error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if field, ok := unknownField(err); ok {
			return InvalidRequest(CodeUnknownParameter, field, "unknown or unsupported field %q", field)
		}
		var se *json.SyntaxError
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
			return InvalidRequest(CodeInvalidJSON, "", "invalid JSON body: %v", err)
		case errors.As(err, &ute):
			return InvalidRequest(CodeInvalidValue, ute.Field, "invalid value for %s: %v", ute.Field, err)
		default:
			return InvalidRequest(CodeInvalidValue, "", "invalid request: %v", err)
		}
	}
	if dec.More() {
		return InvalidRequest(CodeInvalidJSON, "", "invalid JSON body: trailing data after the object")
	}
	return nil
}

// Usage is OpenAI's token accounting.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
	// CompletionTokensDetails counts speculative decoding's drafted tokens (nil when
	// none was drafted).
	CompletionTokensDetails *CompletionTokensDetails `json:"completion_tokens_details,omitempty"`
}

// PromptTokensDetails reports prompt tokens served from the slot's prefix cache.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// ChatMessageOut is the assistant message of a chat completion. Content is null
// when the answer is only tool calls.
type ChatMessageOut struct {
	Role             string     `json:"role"`
	Content          *string    `json:"content"`
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
}

// Text is the content, empty when null.
func (m ChatMessageOut) Text() string {
	if m.Content == nil {
		return ""
	}
	return *m.Content
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int            `json:"index"`
	Message      ChatMessageOut `json:"message"`
	Logprobs     *ChatLogprobs  `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
	// StopSequence is the stop string that ended the choice (an extension of
	// OpenAI's shape; the Anthropic API reports it).
	StopSequence string `json:"stop_sequence,omitempty"`
}

// ChatCompletion is a non-streamed chat completion.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"` // chat.completion
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage,omitempty"`
}

// ChatDelta is the incremental message of a stream chunk.
type ChatDelta struct {
	Role             string     `json:"role,omitempty"`
	Content          *string    `json:"content,omitempty"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
}

// ChatChunkChoice is one choice of a stream chunk.
type ChatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        ChatDelta     `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	StopSequence string        `json:"stop_sequence,omitempty"` // on the chunk with finish_reason
}

// ChatCompletionChunk is one SSE event of a streamed chat completion.
type ChatCompletionChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"` // chat.completion.chunk
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	// Usage is set only on the final chunk when stream_options.include_usage is set.
	Usage *Usage `json:"usage,omitempty"`
}

// TextChoice is one choice of a text completion (streamed or not).
type TextChoice struct {
	Index        int           `json:"index"`
	Text         string        `json:"text"`
	Logprobs     *TextLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
	StopSequence string        `json:"stop_sequence,omitempty"` // as ChatChoice's
}

// Completion is a text completion or one chunk of a streamed one.
type Completion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"` // text_completion
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []TextChoice `json:"choices"`
	Usage   *Usage       `json:"usage,omitempty"`
}

// Embedding is one vector of an embeddings response; Embedding is []float32 or a
// base64 string.
type Embedding struct {
	Object    string `json:"object"` // embedding
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"`
}

// EmbeddingResponse is the answer to POST /v1/embeddings.
type EmbeddingResponse struct {
	Object string      `json:"object"` // list
	Data   []Embedding `json:"data"`
	Model  string      `json:"model"`
	Usage  Usage       `json:"usage"`
}

// NewID returns a random id with the given prefix ("chatcmpl-", "cmpl-").
func NewID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Options are the sampling options with the chat request's logprobs.
func (r *ChatRequest) Options() (Options, *Error) {
	o, e := r.Sampling.Options()
	if e != nil {
		return o, e
	}
	o.Logprobs = r.Logprobs != nil && *r.Logprobs
	if o.Predicted, e = PredictedContent(r.Prediction); e != nil {
		return o, e
	}
	if r.TopLogprobs != nil {
		switch k := *r.TopLogprobs; {
		case k < 0 || k > MaxTopLogprobs:
			return o, InvalidRequest(CodeInvalidValue, "top_logprobs", "top_logprobs must be between 0 and %d, got %d", MaxTopLogprobs, k)
		case k > 0 && !o.Logprobs:
			return o, InvalidRequest(CodeInvalidValue, "top_logprobs", "top_logprobs needs logprobs: true")
		default:
			o.TopLogprobs = k
		}
	}
	return o, nil
}

// Options are the sampling options with the completion request's logprobs (the
// legacy integer: that many alternatives per token).
func (r *CompletionRequest) Options() (Options, *Error) {
	o, e := r.Sampling.Options()
	if e == nil && r.Logprobs != nil {
		o.Logprobs, o.TopLogprobs = true, *r.Logprobs
	}
	return o, e
}

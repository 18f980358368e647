package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/keepalive"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/prefixdigest"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/openaierr"
)

// DefaultPrefixBytes is how much of a prompt's text (see promptPrefix) decides its
// replica under prefix affinity.
const DefaultPrefixBytes = 512

// requestHead is what the gateway reads of a request body: the model, and under prefix
// affinity the prompt whose prefix picks the replica (or the client's
// prompt_cache_key, which names that prefix).
type requestHead struct {
	Model string
	// N is how many choices it asks for (chat and text completions' "n"), 1 when it
	// asks for none or for something that is not a positive count (the agent's 400).
	N int
	// caps are its caps on each choice's output, by the field that sets it.
	caps outputCaps
	// prefix is up to PrefixBytes of the prompt's text; nil without affinity.
	prefix []byte
	// keyed: prefix is the client's prompt_cache_key.
	keyed bool
	// stream: it asks for a stream ("stream": true).
	stream bool
}

// proxied is one request as the gateway serves it, from admission to its answer: where
// the answer goes, the request and its body, the deployment it names and who asks, its
// place in admission, the bound on the usage it is counted for, and when it arrived.
// It travels unchanged through every attempt and continuation of the request.
type proxied struct {
	w    http.ResponseWriter
	r    *http.Request
	body []byte
	// name is the model as the client named it (resolved again on every try).
	name string
	id   tenancy.Identity
	// t is the request's ticket in admission; its request's Model is the deployment's ID.
	t     *admission.Ticket
	lim   metering.Limits
	start time.Time
}

// maxChoices bounds the slots one request is counted for; a larger n is refused by
// the agent anyway.
const maxChoices = 128

// readBody reads the whole body, bounded by limit (413 above it), so that it can be
// replayed to another replica.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *apiError) {
	var buf bytes.Buffer
	if r.ContentLength > 0 && r.ContentLength <= limit {
		buf.Grow(int(r.ContentLength) + 1) // +1: ReadFrom wants room to see EOF
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	body := buf.Bytes()
	if err != nil {
		if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: openaierr.TypeInvalidRequest,
				Code: openaierr.CodeRequestTooLarge, reason: "body_too_large",
				Message: fmt.Sprintf("request body larger than the gateway's limit of %d bytes", mbe.Limit)}
		}
		return nil, invalidRequest(openaierr.CodeInvalidJSON, "", "bad_request", "reading the request body: %v", err)
	}
	return body, nil
}

// parseHead decodes the model (required, a non-empty string) and, when prefixBytes > 0,
// the prompt prefix.
func parseHead(body []byte, prefixBytes int) (requestHead, *apiError) {
	if len(bytes.TrimSpace(body)) == 0 {
		return requestHead{}, invalidRequest(openaierr.CodeInvalidJSON, "", "bad_request",
			"the request body is empty: send a JSON object with a \"model\"")
	}
	var head struct {
		Model *json.RawMessage `json:"model"`
		N     json.RawMessage  `json:"n"`
		// Stream is read as it is: a value that is not a boolean is the agent's 400.
		Stream json.RawMessage `json:"stream"`
		outputCaps
		// PromptCacheKey (chat completions, Responses) names the prefix the client
		// shares between requests: it is the affinity key instead of the prompt's start.
		PromptCacheKey json.RawMessage `json:"prompt_cache_key"`
		conversation
	}
	var err error
	if prefixBytes > 0 {
		err = json.Unmarshal(body, &head)
	} else {
		var m struct {
			Model  *json.RawMessage `json:"model"`
			N      json.RawMessage  `json:"n"`
			Stream json.RawMessage  `json:"stream"`
			outputCaps
		}
		err = json.Unmarshal(body, &m)
		head.Model, head.N, head.Stream, head.outputCaps = m.Model, m.N, m.Stream, m.outputCaps
	}
	if err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) && ute.Field == "" {
			return requestHead{}, invalidRequest(openaierr.CodeInvalidJSON, "", "bad_request", "the request body must be a JSON object")
		}
		return requestHead{}, invalidRequest(openaierr.CodeInvalidJSON, "", "bad_request", "the request body is not valid JSON: %v", err)
	}
	if head.Model == nil || string(*head.Model) == "null" {
		return requestHead{}, invalidRequest(openaierr.CodeMissingField, "model", "bad_request", "the request has no \"model\"")
	}
	var out requestHead
	if json.Unmarshal(*head.Model, &out.Model) != nil || out.Model == "" {
		return requestHead{}, invalidRequest(openaierr.CodeInvalidValue, "model", "bad_request", "\"model\" must be a non-empty string")
	}
	out.N = 1
	if n, err := strconv.Atoi(string(head.N)); err == nil && n > 1 {
		out.N = min(n, maxChoices)
	}
	out.caps = head.outputCaps
	out.stream = keepalive.Streaming(head.Stream)
	if prefixBytes > 0 {
		var key string
		if json.Unmarshal(head.PromptCacheKey, &key) == nil && key != "" {
			out.prefix, out.keyed = []byte("prompt_cache_key\x00"+key), true
		} else {
			out.prefix = head.conversation.prefix(prefixBytes)
		}
	}
	return out, nil
}

// conversation is what the three chat APIs carry of a conversation: chat completions
// and Anthropic messages have messages (Anthropic's system prompt apart), Responses
// has instructions and input (a string or a list of items), text completions a
// prompt, embeddings an input.
type conversation struct {
	Messages     json.RawMessage `json:"messages"`
	System       json.RawMessage `json:"system"`
	Instructions json.RawMessage `json:"instructions"`
	Prompt       json.RawMessage `json:"prompt"`
	Input        json.RawMessage `json:"input"`
}

// message is a chat message, an Anthropic message or a Responses message item.
type message struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// prefix is the start of the conversation in one form for all three chat APIs (the
// system prompt, then each message as "role:text\n" up to the first user message), so
// that one conversation sent through any of them lands on the same replica; for a
// text completion or an embedding, the start of the first input.
func (c conversation) prefix(n int) []byte {
	var msgs []message
	var system []string
	switch {
	case len(c.Messages) > 0:
		if json.Unmarshal(c.Messages, &msgs) != nil {
			return nil
		}
		system = texts(c.System)
	case len(c.Instructions) > 0 || isArrayOfObjects(c.Input):
		system = texts(c.Instructions)
		if isArrayOfObjects(c.Input) {
			if json.Unmarshal(c.Input, &msgs) != nil {
				return nil
			}
		} else if ts := texts(c.Input); len(ts) > 0 {
			msgs = []message{{Role: "user", Content: c.Input}}
		}
	default:
		return promptPrefix(nil, c.Prompt, c.Input, n)
	}
	if len(system) > 0 {
		content, _ := json.Marshal(strings.Join(system, ""))
		msgs = append([]message{{Role: "system", Content: content}}, msgs...)
	}
	raw, _ := json.Marshal(msgs)
	return promptPrefix(raw, nil, nil, n)
}

func isArrayOfObjects(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 1 && raw[0] == '[' && bytes.TrimSpace(raw[1:])[0] == '{'
}

// promptPrefix is up to n bytes of the prompt: the messages as "role:text\n" up to
// and including the first user message (a developer message counts as system), or the
// first string of prompt or input.
func promptPrefix(messages, prompt, input json.RawMessage, n int) []byte {
	out := make([]byte, 0, n)
	add := func(s string) bool {
		out = append(out, s[:min(len(s), n-len(out))]...)
		return len(out) >= n
	}
	if len(messages) > 0 {
		var msgs []message
		_ = json.Unmarshal(messages, &msgs)
		for _, m := range msgs {
			if m.Type != "" && m.Type != "message" {
				continue // a Responses item that is not a message (a function call, its output)
			}
			role := m.Role
			if role == "developer" {
				role = "system"
			}
			if add(role) || add(":") {
				return out
			}
			for _, text := range texts(m.Content) {
				if add(text) {
					return out
				}
			}
			if add("\n") || m.Role == "user" {
				return out
			}
		}
		return out
	}
	for _, raw := range []json.RawMessage{prompt, input} {
		if ts := texts(raw); len(ts) > 0 {
			add(ts[0])
			return out
		}
	}
	return out
}

// texts reads a string, an array of strings, or an array of content parts with "text".
func texts(raw json.RawMessage) []string { return prefixdigest.Texts(raw) }

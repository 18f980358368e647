package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// requestHead is what the gateway reads of a request body: the model, and under prefix
// affinity the prompt whose prefix picks the replica.
type requestHead struct {
	Model string
	// prefix is up to PrefixBytes of the prompt's text; nil without affinity.
	prefix []byte
}

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
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest,
				Code: codeRequestTooLarge, reason: "body_too_large",
				Message: fmt.Sprintf("request body larger than the gateway's limit of %d bytes", mbe.Limit)}
		}
		return nil, invalidRequest(codeInvalidJSON, "", "bad_request", "reading the request body: %v", err)
	}
	return body, nil
}

// parseHead decodes the model (required, a non-empty string) and, when prefixBytes > 0,
// the prompt prefix.
func parseHead(body []byte, prefixBytes int) (requestHead, *apiError) {
	if len(bytes.TrimSpace(body)) == 0 {
		return requestHead{}, invalidRequest(codeInvalidJSON, "", "bad_request",
			"the request body is empty: send a JSON object with a \"model\"")
	}
	var head struct {
		Model    *json.RawMessage `json:"model"`
		Messages json.RawMessage  `json:"messages"`
		Prompt   json.RawMessage  `json:"prompt"`
		Input    json.RawMessage  `json:"input"`
	}
	var err error
	if prefixBytes > 0 {
		err = json.Unmarshal(body, &head)
	} else {
		var m struct {
			Model *json.RawMessage `json:"model"`
		}
		err = json.Unmarshal(body, &m)
		head.Model = m.Model
	}
	if err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) && ute.Field == "" {
			return requestHead{}, invalidRequest(codeInvalidJSON, "", "bad_request", "the request body must be a JSON object")
		}
		return requestHead{}, invalidRequest(codeInvalidJSON, "", "bad_request", "the request body is not valid JSON: %v", err)
	}
	if head.Model == nil || string(*head.Model) == "null" {
		return requestHead{}, invalidRequest(codeMissingField, "model", "bad_request", "the request has no \"model\"")
	}
	var out requestHead
	if json.Unmarshal(*head.Model, &out.Model) != nil || out.Model == "" {
		return requestHead{}, invalidRequest(codeInvalidValue, "model", "bad_request", "\"model\" must be a non-empty string")
	}
	if prefixBytes > 0 {
		out.prefix = promptPrefix(head.Messages, head.Prompt, head.Input, prefixBytes)
	}
	return out, nil
}

// promptPrefix is up to n bytes of a prompt's text: for a chat, the role and text
// content of each message up to and including the first user message (the system
// prompt and the question that opened the conversation — what every later turn of the
// same conversation repeats, so all its turns find their KV cache on one replica);
// else the (first) completion prompt, else the (first) embeddings input. JSON
// formatting does not change it. It is empty when there is no text; malformed parts
// are skipped (the agent validates the request).
func promptPrefix(messages, prompt, input json.RawMessage, n int) []byte {
	out := make([]byte, 0, n)
	add := func(s string) bool {
		out = append(out, s[:min(len(s), n-len(out))]...)
		return len(out) >= n
	}
	if len(messages) > 0 {
		var msgs []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		_ = json.Unmarshal(messages, &msgs)
		for _, m := range msgs {
			if add(m.Role) || add(":") {
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
func texts(raw json.RawMessage) []string {
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
			var part struct {
				Text string `json:"text"`
			}
			if json.Unmarshal(p, &part) == nil && part.Text != "" {
				out = append(out, part.Text)
			}
		}
		return out
	}
	return nil
}

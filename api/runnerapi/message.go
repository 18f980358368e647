package runnerapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Message is one chat message. Content is a string or an array of text and image
// parts.
type Message struct {
	Role    string         `json:"role"`
	Content MessageContent `json:"content"`
	// Name is the participant's name (user, system) or the tool's (tool).
	Name string `json:"name,omitempty"`
	// ToolCalls are the calls of an assistant message in the history.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// ReasoningContent is an assistant message's reasoning, for templates that show
	// it (most drop it from past turns).
	ReasoningContent string `json:"reasoning_content,omitempty"`
	// Refusal, Annotations, Audio and FunctionCall come back with an assistant message
	// that a client returns in the history; they are accepted when empty.
	Refusal *string `json:"refusal,omitempty"`
	// Parsed is what the official SDKs' parse helpers add to a message they hand
	// back; it is derived from the content and ignored.
	Parsed       json.RawMessage `json:"parsed,omitempty"`
	Annotations  json.RawMessage `json:"annotations,omitempty"`
	Audio        json.RawMessage `json:"audio,omitempty"`
	FunctionCall json.RawMessage `json:"function_call,omitempty"`
	// Images are the message's image parts, each standing at its place in Content;
	// on the wire they are image_url parts of a content array.
	Images []Image `json:"-"`
}

// Image is an image part of a message: its URL (the runner reads data: URIs only;
// the gateway inlines others) and where it stands in the message's Content.
type Image struct {
	URL string
	// Detail is OpenAI's resolution hint (low, high, auto): accepted and ignored.
	Detail string
	// At is the byte offset in Content the image comes before.
	At int
}

// contentPart is one element of a content array.
type contentPart struct {
	Type     string    `json:"type"`
	Text     *string   `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

// messageFields is Message without its methods.
type messageFields Message

// UnmarshalJSON implements json.Unmarshaler: the fields strictly (an unknown one is
// an error, as DecodeJSON makes it at the top level), the content a string, null or
// an array of text and image_url parts.
func (m *Message) UnmarshalJSON(b []byte) error {
	aux := struct {
		*messageFields
		Content json.RawMessage `json:"content"`
	}{messageFields: (*messageFields)(m)}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&aux); err != nil {
		return err
	}
	m.Content, m.Images = "", nil
	c := bytes.TrimSpace(aux.Content)
	if len(c) == 0 {
		return nil
	}
	if c[0] != '[' {
		return m.Content.UnmarshalJSON(c)
	}
	var parts []contentPart
	if err := json.Unmarshal(c, &parts); err != nil {
		return err
	}
	var sb strings.Builder
	for _, p := range parts {
		switch {
		case p.Type == "text" && p.Text != nil:
			sb.WriteString(*p.Text)
		case p.Type == "image_url" && p.ImageURL != nil:
			m.Images = append(m.Images, Image{URL: p.ImageURL.URL, Detail: p.ImageURL.Detail, At: sb.Len()})
		default:
			return fmt.Errorf("content part of type %q is not supported: send text and image_url parts", p.Type)
		}
	}
	m.Content = MessageContent(sb.String())
	return nil
}

// MarshalJSON implements json.Marshaler: the content a string, or with images an
// array of text and image_url parts in their order.
func (m Message) MarshalJSON() ([]byte, error) {
	if len(m.Images) == 0 {
		return json.Marshal(messageFields(m))
	}
	return json.Marshal(struct {
		messageFields
		Content []contentPart `json:"content"`
	}{messageFields(m), m.contentParts()})
}

// contentParts are the message's text and images as a content array.
func (m Message) contentParts() []contentPart {
	text := string(m.Content)
	var parts []contentPart
	off := 0
	for _, img := range m.Images {
		at := min(max(img.At, off), len(text))
		if at > off {
			parts = append(parts, contentPart{Type: "text", Text: ptrTo(text[off:at])})
		}
		parts = append(parts, contentPart{Type: "image_url", ImageURL: &imageURL{URL: img.URL, Detail: img.Detail}})
		off = at
	}
	if off < len(text) {
		parts = append(parts, contentPart{Type: "text", Text: ptrTo(text[off:])})
	}
	return parts
}

func ptrTo[T any](v T) *T { return &v }

// MessageContent is the text of a message: OpenAI allows a string, null, or an array
// of content parts of which the runner accepts the text ones.
type MessageContent string

// UnmarshalJSON implements json.Unmarshaler.
func (c *MessageContent) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*c = ""
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = MessageContent(s)
		return nil
	case len(b) > 0 && b[0] == '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(b, &parts); err != nil {
			return err
		}
		var sb strings.Builder
		for _, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return fmt.Errorf("content part of type %q is not supported: the models served are text-only", p.Type)
			}
			sb.WriteString(*p.Text)
		}
		*c = MessageContent(sb.String())
		return nil
	}
	return errors.New("content must be a string or an array of text parts")
}

package translate

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// part is one part of a chat message's content as the chat API writes it: text, or
// an image (an image_url part whose URL is a data URI or an http(s) URL, which the
// fleet inlines before the runner sees it).
type part struct {
	Type     string    `json:"type"`
	Text     *string   `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

func textPart(s string) part { return part{Type: "text", Text: &s} }

func imagePart(url, detail string) part {
	return part{Type: "image_url", ImageURL: &imageURL{URL: url, Detail: detail}}
}

// content collects a message's content as it is read: its text, and its parts in
// order once an image is among them.
type content struct {
	text  strings.Builder
	parts []part
	image bool
}

func (c *content) addText(s string) {
	c.text.WriteString(s)
	if s != "" {
		c.parts = append(c.parts, textPart(s))
	}
}

func (c *content) addImage(p part) {
	c.parts = append(c.parts, p)
	c.image = true
}

// imageParts are the content parts of the messages of a translated request that hold
// an image, by the message's index in chat["messages"].
type imageParts map[int][]part

// partsKey is the key of a translated request's imageParts in its chat map; no
// request field has a name with a space, and marshalChat takes it out.
const partsKey = " image parts"

// shifted is p with every index moved by n (messages put before them).
func (p imageParts) shifted(n int) imageParts {
	out := imageParts{}
	for i, v := range p {
		out[i+n] = v
	}
	return out
}

// marshalChat is the body of a translated chat request: chat as it is, but that the
// messages holding an image carry their content as a list of parts.
func marshalChat(chat map[string]any) []byte {
	parts, _ := chat[partsKey].(imageParts)
	if len(parts) == 0 {
		b, _ := json.Marshal(chat)
		return b
	}
	out := maps.Clone(chat)
	delete(out, partsKey)
	msgs, _ := chat["messages"].([]runnerapi.Message)
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = m
		if p, ok := parts[i]; ok {
			list[i] = withParts{m, p}
		}
	}
	out["messages"] = list
	b, _ := json.Marshal(out)
	return b
}

// withParts is a chat message whose content is a list of parts.
type withParts struct {
	runnerapi.Message
	parts []part
}

// MarshalJSON implements json.Marshaler.
func (m withParts) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(m.Message)
	if err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, err
	}
	if obj["content"], err = json.Marshal(m.parts); err != nil {
		return nil, err
	}
	return json.Marshal(obj)
}

// imageMediaTypes are the media types an Anthropic base64 image source may name.
var imageMediaTypes = []string{"image/jpeg", "image/png", "image/gif", "image/webp"}

// anthropicImage is the chat image part of an Anthropic image block's source (named
// param in errors): a base64 source becomes a data URI, a URL source stays a URL for
// the fleet to fetch under its source policy; a file source is refused (there is no
// Files API).
func anthropicImage(raw json.RawMessage, param string) (part, *chatError) {
	var src struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
		FileID    string `json:"file_id"`
	}
	if len(raw) == 0 {
		return part{}, invalid(param, "an image block needs a source: {\"type\":\"base64\",\"media_type\":...,\"data\":...} or {\"type\":\"url\",\"url\":...}")
	}
	if e := decodeStrict(raw, &src, nil, param); e != nil {
		return part{}, e
	}
	switch src.Type {
	case "base64":
		if !slices.Contains(imageMediaTypes, src.MediaType) {
			return part{}, invalid(param+".media_type", "media_type must be one of %s, got %q", strings.Join(imageMediaTypes, ", "), src.MediaType)
		}
		if src.Data == "" {
			return part{}, invalid(param+".data", "data is required: the image's bytes in base64")
		}
		if _, err := base64.StdEncoding.DecodeString(src.Data); err != nil {
			return part{}, invalid(param+".data", "data is not valid base64: %v", err)
		}
		return imagePart("data:"+src.MediaType+";base64,"+src.Data, ""), nil
	case "url":
		if e := checkImageURL(src.URL, param+".url"); e != nil {
			return part{}, e
		}
		return imagePart(src.URL, ""), nil
	case "file":
		return part{}, unsupported(param+".type", "file sources are not supported (there is no Files API): send the image as a base64 or url source")
	}
	return part{}, invalid(param+".type", "an image source's type must be base64 or url, got %q", src.Type)
}

// checkImageURL refuses an image URL (named param in errors) that is neither a data
// URI of an image nor an http(s) URL.
func checkImageURL(u, param string) *chatError {
	lower := strings.ToLower(u)
	switch {
	case u == "":
		return invalid(param, "the image's URL is required")
	case strings.HasPrefix(lower, "data:"):
		if !strings.HasPrefix(lower, "data:image/") || !strings.Contains(lower, ";base64,") {
			return invalid(param, "a data URI image must be data:image/<type>;base64,<data>")
		}
		return nil
	case strings.HasPrefix(lower, "https://"), strings.HasPrefix(lower, "http://"):
		return nil
	}
	return invalid(param, "an image URL must be an https:// URL or a data:image/...;base64 URI")
}

// responsesImage is the chat image part of a Responses input_image part (named param
// in errors): its image_url (a data URI or an http(s) URL) and detail; a file_id is
// refused (there is no Files API).
func responsesImage(imageURL *string, fileID, detail, param string) (part, *chatError) {
	if fileID != "" {
		return part{}, unsupported(param+".file_id", "file_id is not supported (there is no Files API): send the image as image_url, a data URI or an https URL")
	}
	if imageURL == nil {
		return part{}, invalid(param+".image_url", "an input_image part needs image_url")
	}
	if e := checkImageURL(*imageURL, param+".image_url"); e != nil {
		return part{}, e
	}
	return imagePart(*imageURL, detail), nil
}

package translate

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// content collects a message's content as it is read: its text, and its images
// each at its place in the text (runnerapi.Image.At).
type content struct {
	text   strings.Builder
	images []runnerapi.Image
}

func (c *content) addText(s string) { c.text.WriteString(s) }

func (c *content) addImage(img runnerapi.Image) {
	img.At = c.text.Len()
	c.images = append(c.images, img)
}

// imageMediaTypes are the media types an Anthropic base64 image source may name.
var imageMediaTypes = []string{"image/jpeg", "image/png", "image/gif", "image/webp"}

// anthropicImage is the chat image part of an Anthropic image block's source (named
// param in errors): a base64 source becomes a data URI, a URL source stays a URL for
// the fleet to fetch under its source policy; a file source is refused (there is no
// Files API).
func anthropicImage(raw json.RawMessage, param string) (runnerapi.Image, *chatError) {
	var src struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
		FileID    string `json:"file_id"`
	}
	if len(raw) == 0 {
		return runnerapi.Image{}, invalid(param, "an image block needs a source: {\"type\":\"base64\",\"media_type\":...,\"data\":...} or {\"type\":\"url\",\"url\":...}")
	}
	if e := decodeStrict(raw, &src, nil, param); e != nil {
		return runnerapi.Image{}, e
	}
	switch src.Type {
	case "base64":
		if !slices.Contains(imageMediaTypes, src.MediaType) {
			return runnerapi.Image{}, invalid(param+".media_type", "media_type must be one of %s, got %q", strings.Join(imageMediaTypes, ", "), src.MediaType)
		}
		if src.Data == "" {
			return runnerapi.Image{}, invalid(param+".data", "data is required: the image's bytes in base64")
		}
		if _, err := base64.StdEncoding.DecodeString(src.Data); err != nil {
			return runnerapi.Image{}, invalid(param+".data", "data is not valid base64: %v", err)
		}
		return runnerapi.Image{URL: "data:" + src.MediaType + ";base64," + src.Data}, nil
	case "url":
		if e := checkImageURL(src.URL, param+".url"); e != nil {
			return runnerapi.Image{}, e
		}
		return runnerapi.Image{URL: src.URL}, nil
	case "file":
		return runnerapi.Image{}, unsupported(param+".type", "file sources are not supported (there is no Files API): send the image as a base64 or url source")
	}
	return runnerapi.Image{}, invalid(param+".type", "an image source's type must be base64 or url, got %q", src.Type)
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
func responsesImage(imageURL *string, fileID, detail, param string) (runnerapi.Image, *chatError) {
	if fileID != "" {
		return runnerapi.Image{}, unsupported(param+".file_id", "file_id is not supported (there is no Files API): send the image as image_url, a data URI or an https URL")
	}
	if imageURL == nil {
		return runnerapi.Image{}, invalid(param+".image_url", "an input_image part needs image_url")
	}
	if e := checkImageURL(*imageURL, param+".image_url"); e != nil {
		return runnerapi.Image{}, e
	}
	return runnerapi.Image{URL: *imageURL, Detail: detail}, nil
}

// Package imagefetch inlines the images of a chat completion request: every
// image_url part whose URL is http(s) is fetched, under the fleet's source policy,
// and replaced by a data: URI of its bytes, so that the runner (which takes only data
// URIs) never makes a network request and the prompt cache keys the image by what
// it is, not by where it was.
//
// The decisions are pure and table-tested: which parts to fetch (Plan), whether a
// response is an image that may be inlined (CheckResponse). Inliner makes the
// requests: through a client whose connections the source policy checks (the
// sourcepolicy Holder's Client: no loopback, link-local or private address, no
// redirect from https to http), after Allow has passed the URL (the namespace's
// rules: an image host is a source host like any other).
package imagefetch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strings"
)

// Defaults of Inliner.
const (
	// DefaultMaxBytes bounds one image: as large as the hosted APIs take.
	DefaultMaxBytes = 20 << 20
	// DefaultMaxImages bounds the images of one request that are fetched.
	DefaultMaxImages = 16
)

// MediaTypes are the image types inlined: those the runner's image decoder reads.
var MediaTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp"}

// Error is why a request's images could not be inlined: a 400 for the caller, with
// the part it names (messages[i].content[j].image_url.url).
type Error struct {
	Param   string
	Message string
}

func (e *Error) Error() string { return e.Param + ": " + e.Message }

// Ref is an image_url part of a request whose URL is to be fetched.
type Ref struct {
	Message, Part int
	URL           string
}

// Param is where the part stands in the request, as errors name it.
func (r Ref) Param() string {
	return fmt.Sprintf("messages[%d].content[%d].image_url.url", r.Message, r.Part)
}

// chatRequest is what Plan reads of a chat request.
type chatRequest struct {
	Messages []struct {
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

type imagePart struct {
	Type     string `json:"type"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
}

// Plan lists the image_url parts of the chat request body whose URLs are to be
// fetched (http and https), in order; a data: URI is left as it is, any other URL
// is an *Error, and so are more than maxImages to fetch. A body that does not decode
// is not Plan's to refuse: it has nothing to fetch, and the server's own decoding
// answers it.
func Plan(body []byte, maxImages int) ([]Ref, error) {
	if !bytes.Contains(body, []byte("image_url")) {
		return nil, nil
	}
	var req chatRequest
	if json.Unmarshal(body, &req) != nil {
		return nil, nil
	}
	var refs []Ref
	for i, m := range req.Messages {
		c := bytes.TrimSpace(m.Content)
		if len(c) == 0 || c[0] != '[' {
			continue
		}
		var parts []imagePart
		if json.Unmarshal(c, &parts) != nil {
			continue
		}
		for j, p := range parts {
			if p.Type != "image_url" || p.ImageURL == nil {
				continue
			}
			ref := Ref{Message: i, Part: j, URL: p.ImageURL.URL}
			switch scheme(p.ImageURL.URL) {
			case "data":
				continue
			case "http", "https":
				refs = append(refs, ref)
			default:
				return nil, &Error{Param: ref.Param(), Message: "an image URL must be an https:// URL or a data:image/...;base64 URI"}
			}
		}
	}
	if len(refs) > maxImages {
		return nil, &Error{Param: refs[maxImages].Param(),
			Message: fmt.Sprintf("at most %d images of a request are fetched by URL: send the others inline as data: URIs", maxImages)}
	}
	return refs, nil
}

// scheme is the lower-cased scheme of URL u ("" without one).
func scheme(u string) string {
	s, _, ok := strings.Cut(u, ":")
	if !ok {
		return ""
	}
	return strings.ToLower(s)
}

// Response is what CheckResponse looks at of a fetched image.
type Response struct {
	Status int
	// ContentType is the response's Content-Type header.
	ContentType string
	// Length is the response's Content-Length (-1 when unknown).
	Length int64
	// Head is the body's first bytes (up to 512), to recognise the image by.
	Head []byte
}

// CheckResponse says whether a fetched response is an image that may be inlined,
// and its media type: a 200, no longer than maxBytes as far as its length is known,
// whose Content-Type names an image type of MediaTypes (or, when it names none or a
// generic binary type, whose bytes are recognised as one).
func CheckResponse(r Response, maxBytes int64) (string, error) {
	if r.Status != http.StatusOK {
		return "", fmt.Errorf("fetching the image answered HTTP %d", r.Status)
	}
	if r.Length > maxBytes {
		return "", tooLarge(maxBytes)
	}
	declared, _, _ := mime.ParseMediaType(r.ContentType)
	declared = strings.ToLower(declared)
	sniffed, _, _ := mime.ParseMediaType(http.DetectContentType(r.Head))
	switch {
	case slices.Contains(MediaTypes, declared):
		return declared, nil
	case declared != "" && declared != "application/octet-stream" && declared != "binary/octet-stream":
		return "", fmt.Errorf("the URL is not an image: its Content-Type is %q (one of %s is inlined)", declared, strings.Join(MediaTypes, ", "))
	case slices.Contains(MediaTypes, sniffed):
		return sniffed, nil
	}
	return "", fmt.Errorf("the URL's content is not an image of a type inlined (%s)", strings.Join(MediaTypes, ", "))
}

func tooLarge(maxBytes int64) error {
	return fmt.Errorf("the image is larger than %d MiB: send a smaller one", maxBytes>>20)
}

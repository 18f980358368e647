package imagefetch

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Inliner fetches the images a chat request names by URL and puts them inline.
type Inliner struct {
	// Client makes the requests; its transport must check every address it dials
	// against the source policy (sourcepolicy.Holder.Client).
	Client *http.Client
	// Admit says whether url may be fetched (the source policy's rules for the
	// caller's namespace), and returns the context to fetch it with (one that makes
	// the client check redirect targets by the same rules: sourcepolicy.ForSource).
	// Nil admits every URL with the context as it is.
	Admit func(ctx context.Context, url string) (context.Context, error)
	// MaxBytes bounds one image (DefaultMaxBytes when zero); MaxImages the images of
	// one request fetched by URL (DefaultMaxImages when zero).
	MaxBytes  int64
	MaxImages int
}

// Inline returns body with every http(s) image_url of its messages replaced by a data:
// URI of the image fetched; a body without one comes back as it is. An *Error is
// the caller's to fix (a 400 naming the part); ctx's end stops the fetches.
func (in *Inliner) Inline(ctx context.Context, body []byte) ([]byte, error) {
	maxImages, maxBytes := in.MaxImages, in.MaxBytes
	if maxImages <= 0 {
		maxImages = DefaultMaxImages
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	refs, err := Plan(body, maxImages)
	if err != nil || len(refs) == 0 {
		return body, err
	}
	uris := map[string]string{}
	for _, ref := range refs {
		if _, done := uris[ref.URL]; done {
			continue
		}
		uri, err := in.fetch(ctx, ref.URL, maxBytes)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				e = &Error{Message: err.Error()}
			}
			e.Param = ref.Param()
			return nil, e
		}
		uris[ref.URL] = uri
	}
	return rewrite(body, refs, uris)
}

// fetch returns the image at url as a data: URI.
func (in *Inliner) fetch(ctx context.Context, url string, maxBytes int64) (string, error) {
	if in.Admit != nil {
		var err error
		if ctx, err = in.Admit(ctx, url); err != nil {
			return "", &Error{Message: fmt.Sprintf("the image URL may not be fetched: %v", err)}
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", &Error{Message: fmt.Sprintf("the image URL is not valid: %v", err)}
	}
	req.Header.Set("Accept", "image/*")
	client := in.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", &Error{Message: fmt.Sprintf("fetching the image failed: %v", err)}
	}
	defer func() { _ = resp.Body.Close() }()
	head := make([]byte, 512)
	n, err := io.ReadFull(resp.Body, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", &Error{Message: fmt.Sprintf("reading the image failed: %v", err)}
	}
	head = head[:n]
	mediaType, err := CheckResponse(Response{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"),
		Length: resp.ContentLength, Head: head}, maxBytes)
	if err != nil {
		return "", err
	}
	rest, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes+1-int64(n)))
	if err != nil {
		return "", &Error{Message: fmt.Sprintf("reading the image failed: %v", err)}
	}
	data := append(head, rest...)
	if int64(len(data)) > maxBytes {
		return "", tooLarge(maxBytes)
	}
	return "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(data), nil
}

// rewrite is body with the URL of each part refs names replaced by uris[its URL];
// the rest of each part (its detail) and of the request is kept.
func rewrite(body []byte, refs []Ref, uris map[string]string) ([]byte, error) {
	var req map[string]json.RawMessage
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(req["messages"], &msgs); err != nil {
		return nil, err
	}
	contents := map[int][]map[string]json.RawMessage{}
	for _, ref := range refs {
		parts, ok := contents[ref.Message]
		if !ok {
			if err := json.Unmarshal(msgs[ref.Message]["content"], &parts); err != nil {
				return nil, err
			}
			contents[ref.Message] = parts
		}
		var img map[string]json.RawMessage
		if err := json.Unmarshal(parts[ref.Part]["image_url"], &img); err != nil {
			return nil, err
		}
		img["url"], _ = json.Marshal(uris[ref.URL])
		parts[ref.Part]["image_url"], _ = json.Marshal(img)
	}
	for i, parts := range contents {
		msgs[i]["content"], _ = json.Marshal(parts)
	}
	req["messages"], _ = json.Marshal(msgs)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(req); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

//go:build cgo && !race

package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
)

// Image input: a runner started with a projector (--mmproj) reads the image parts of
// user messages. The chat is rendered with a marker where each image stands, a random
// one per process so that no text can place an image; mtmd tokenizes the prompt into
// text and image pieces; each image takes its positions in the slot's token list as
// stand-in ids derived from its bytes (so the slot's prefix reuse and the prompt
// cache match an image by its bytes), and the engine evaluates it alone when the
// slot's prefill reaches it (engine_vision.go).

// loadProjector loads the projector at path for m (nil without a path). A split
// runner takes none: an image's decode would run the workers' layers outside the
// link's step accounting.
func loadProjector(path string, m *llama.Model, threads int, gpu, split bool) (*llama.Projector, error) {
	if path == "" {
		return nil, nil
	}
	if split {
		return nil, errors.New("--mmproj: a split runner does not read images; serve the model unsplit")
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	marker := "<__image_" + hex.EncodeToString(b[:]) + "__>"
	p, err := llama.LoadProjector(path, m, marker, threads, gpu)
	if err != nil {
		return nil, fmt.Errorf("--mmproj: %w", err)
	}
	return p, nil
}

// promptImage is an image of a prompt: its positions [start, start+n) in the job's
// tokens and the chunk the projector evaluates.
type promptImage struct {
	start, n int
	proj     *llama.Projector
	chunk    *llama.ImageChunk
}

// imageAt is the image that starts at position i of j's prompt, or nil.
func (j *job) imageAt(i int) *promptImage {
	for k := range j.images {
		if j.images[k].start == i {
			return &j.images[k]
		}
	}
	return nil
}

// textEnd is where the text run of j's prompt that position i is in ends: the next
// image's start, or the prompt's end.
func (j *job) textEnd(i int) int {
	end := len(j.tokens)
	for _, im := range j.images {
		if im.start >= i && im.start < end {
			end = im.start
		}
	}
	return end
}

// imageFloor is keep moved back to the start of the image it falls inside, if any: a
// slot's cached state that ends inside an image cannot be continued, since an image is
// evaluated whole.
func (j *job) imageFloor(keep int) int {
	for _, im := range j.images {
		if keep > im.start && keep < im.start+im.n {
			return im.start
		}
	}
	return keep
}

// noProjector is the error for images sent to a runner without a projector.
func noProjector(param string) *runnerapi.Error {
	return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param,
		"this model has no projector (mmproj) loaded, so it cannot read images: "+
			"name the model's projector in the deployment's spec.model.projector")
}

// withImages is req with a marker in each message's content where its images stand,
// and the images' bytes in the order the markers come; req itself when it has none.
func (cr *chatRenderer) withImages(req *runnerapi.ChatRequest) (*runnerapi.ChatRequest, [][]byte, *runnerapi.Error) {
	var images [][]byte
	var out *runnerapi.ChatRequest
	for i, m := range req.Messages {
		if len(m.Images) == 0 {
			continue
		}
		param := fmt.Sprintf("messages[%d].content", i)
		if cr.proj == nil {
			return nil, nil, noProjector(param)
		}
		if m.Role != "user" {
			return nil, nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param,
				"images go in user messages, not %s ones", clipText(m.Role, 16))
		}
		if out == nil {
			cp := *req
			cp.Messages = append([]runnerapi.Message(nil), req.Messages...)
			out = &cp
		}
		var sb strings.Builder
		text, off := string(m.Content), 0
		for k, im := range m.Images {
			b, herr := decodeDataURI(im.URL, fmt.Sprintf("%s[%d].image_url.url", param, k))
			if herr != nil {
				return nil, nil, herr
			}
			images = append(images, b)
			at := min(max(im.At, off), len(text))
			sb.WriteString(text[off:at])
			sb.WriteString(cr.proj.Marker())
			off = at
		}
		sb.WriteString(text[off:])
		out.Messages[i].Content, out.Messages[i].Images = runnerapi.MessageContent(sb.String()), nil
	}
	if out == nil {
		return req, nil, nil
	}
	return out, images, nil
}

// renderImages renders req (as render does) with its images' markers, and the
// images in the order the markers come.
func (cr *chatRenderer) renderImages(req *runnerapi.ChatRequest) (string, [][]byte, *runnerapi.Error) {
	marked, images, herr := cr.withImages(req)
	if herr != nil {
		return "", nil, herr
	}
	prompt, herr := cr.render(marked)
	return prompt, images, herr
}

// decodeDataURI is the bytes of a data: URI of an image (base64 or percent-encoded).
func decodeDataURI(uri, param string) ([]byte, *runnerapi.Error) {
	rest, ok := strings.CutPrefix(uri, "data:")
	if !ok {
		return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param,
			"images must be inlined as data URIs (data:image/png;base64,...); got a URL starting %q", clipText(uri, 24))
	}
	meta, data, ok := strings.Cut(rest, ",")
	if !ok {
		return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "the data URI has no comma before its data")
	}
	if !strings.HasPrefix(meta, "image/") {
		return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param,
			"the data URI's media type must be an image type (image/png, image/jpeg …), got %q", clipText(meta, 32))
	}
	if !strings.HasSuffix(meta, ";base64") {
		return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "the image's data URI must be base64 (data:image/png;base64,...)")
	}
	b, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "the image's base64 data does not decode: %v", err)
	}
	if len(b) == 0 {
		return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "the image is empty")
	}
	return b, nil
}

// imagePrompt tokenizes prompt, in which the projector's marker stands for each of
// images in turn, into the job's tokens (an image's positions hold its stand-in id)
// and its images.
func (cr *chatRenderer) imagePrompt(prompt string, images [][]byte) ([]int32, []promptImage, *runnerapi.Error) {
	if n := strings.Count(prompt, cr.proj.Marker()); n != len(images) {
		// A template that drops or repeats a message's content.
		return nil, nil, runnerapi.InvalidRequest(runnerapi.CodeTemplateError, "messages",
			"the chat template rendered %d of the %d images", n, len(images))
	}
	pieces, err := cr.proj.Tokenize(prompt, images)
	if err != nil {
		return nil, nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "messages", "reading the images: %v", err)
	}
	var toks []int32
	var ims []promptImage
	nVocab := int32(cr.model.NVocab())
	for _, p := range pieces {
		if p.Image == nil {
			toks = append(toks, p.Tokens...)
			continue
		}
		id := standIn(nVocab, images[len(ims)])
		ims = append(ims, promptImage{start: len(toks), n: p.NTokens, proj: cr.proj, chunk: p.Image})
		for range p.NTokens {
			toks = append(toks, id)
		}
	}
	if len(ims) != len(images) {
		return nil, nil, runnerapi.Internal("the prompt tokenized into %d images, not %d", len(ims), len(images))
	}
	if len(ims) > 0 && ims[len(ims)-1].start+ims[len(ims)-1].n == len(toks) {
		return nil, nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "messages", "the prompt must not end with an image")
	}
	return toks, ims, nil
}

// standIn is the token id an image's positions hold in a slot's token list: outside
// the vocabulary (never sampled or detokenized), from the SHA-256 of the image's
// bytes, so that the same image matches and another does not.
func standIn(nVocab int32, image []byte) int32 {
	h := sha256.Sum256(image)
	return nVocab + int32(binary.BigEndian.Uint32(h[:4])&(1<<30-1))
}

//go:build cgo && !race

package llama

/*
#include <stdlib.h>
#include "llama.h"
#include "../tools/mtmd/mtmd.h" // found beside the include directory of llama.h
#include "../tools/mtmd/mtmd-helper.h"

static struct mtmd_context *mf_mtmd_init(const char *path, const struct llama_model *m, const char *marker,
		int threads, _Bool gpu) {
	struct mtmd_context_params p = mtmd_context_params_default();
	p.use_gpu = gpu;
	p.print_timings = 0;
	p.n_threads = threads;
	p.media_marker = marker;
	p.warmup = 0;
	return mtmd_init_from_file(path, m, p);
}

// mf_mtmd_tokenize splits text at the marker into chunks, the i-th marker taking the
// i-th bitmap; NULL with *rc set when it fails.
static mtmd_input_chunks *mf_mtmd_tokenize(struct mtmd_context *ctx, const char *text,
		const mtmd_bitmap **bitmaps, size_t n, int32_t *rc) {
	mtmd_input_chunks *out = mtmd_input_chunks_init();
	mtmd_input_text in = { text, 1, 1 };
	*rc = mtmd_tokenize(ctx, out, &in, bitmaps, n);
	if (*rc != 0) {
		mtmd_input_chunks_free(out);
		return NULL;
	}
	return out;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	// mtmd (multimodal input) and clip with its vision graphs, compiled by cgo.
	_ "github.com/ollama/ollama/llama/llama.cpp/tools/mtmd"
	_ "github.com/ollama/ollama/llama/llama.cpp/tools/mtmd/models"
)

// Projector is a loaded multimodal projector (an mmproj GGUF): it turns images into
// embeddings in the text model's input space. Tokenize and the Image queries are safe
// for concurrent use; EvalImage serializes the encoder.
type Projector struct {
	c      *C.struct_mtmd_context
	marker string
	mu     sync.Mutex // the encoder's buffers
}

// LoadProjector loads the projector at path for the text model m. marker is the text
// that stands for an image in a prompt passed to Tokenize.
func LoadProjector(path string, m *Model, marker string, threads int, gpu bool) (*Projector, error) {
	cpath, cmark := C.CString(path), C.CString(marker)
	defer C.free(unsafe.Pointer(cpath))
	defer C.free(unsafe.Pointer(cmark))
	c := C.mf_mtmd_init(cpath, m.c, cmark, C.int(max(threads, 1)), C._Bool(gpu))
	if c == nil {
		return nil, fmt.Errorf("the projector %s does not load for this model (see llama.cpp's log on stderr)", path)
	}
	if !bool(C.mtmd_support_vision(c)) {
		C.mtmd_free(c)
		return nil, fmt.Errorf("the projector %s has no vision encoder", path)
	}
	if bool(C.mtmd_decode_use_mrope(c)) {
		// Positions that are not one per token (M-RoPE) would need their own
		// bookkeeping in the runner's slots.
		C.mtmd_free(c)
		return nil, fmt.Errorf("the projector %s places image tokens with M-RoPE positions, which the runner does not support", path)
	}
	return &Projector{c: c, marker: marker}, nil
}

// Free releases the projector.
func (p *Projector) Free() {
	if p != nil && p.c != nil {
		C.mtmd_free(p.c)
		p.c = nil
	}
}

// Marker is the text that stands for an image in a prompt.
func (p *Projector) Marker() string { return p.marker }

// NonCausal reports whether an image's tokens attend to each other both ways, which
// needs the whole image in one micro-batch.
func (p *Projector) NonCausal() bool { return bool(C.mtmd_decode_use_non_causal(p.c)) }

// Piece is one part of a tokenized prompt: text tokens, or an image of NTokens
// positions (Image set).
type Piece struct {
	Tokens  []int32
	Image   *ImageChunk
	NTokens int
}

// ImageChunk is an image's tokens, ready to be encoded; freed when unreachable.
type ImageChunk struct {
	c *C.mtmd_input_chunk
}

// Tokenize tokenizes text, in which the i-th Marker stands for images[i] (encoded
// bytes of a PNG, JPEG, GIF, BMP… picture), into pieces. Special tokens are parsed,
// and BOS is added as the model is configured to.
func (p *Projector) Tokenize(text string, images [][]byte) ([]Piece, error) {
	bitmaps := make([]*C.mtmd_bitmap, len(images))
	defer func() {
		for _, b := range bitmaps {
			if b != nil {
				C.mtmd_bitmap_free(b)
			}
		}
	}()
	for i, img := range images {
		if len(img) == 0 {
			return nil, fmt.Errorf("image %d is empty", i)
		}
		cimg := C.CBytes(img)
		bitmaps[i] = C.mtmd_helper_bitmap_init_from_buf(p.c, (*C.uchar)(cimg), C.size_t(len(img)))
		C.free(cimg)
		if bitmaps[i] == nil {
			return nil, fmt.Errorf("image %d is not a picture this runner decodes (PNG, JPEG, GIF, BMP)", i)
		}
	}
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	var list **C.mtmd_bitmap
	if len(bitmaps) > 0 {
		arr := (**C.mtmd_bitmap)(C.calloc(C.size_t(len(bitmaps)), C.size_t(unsafe.Sizeof(uintptr(0)))))
		defer C.free(unsafe.Pointer(arr))
		copy(unsafe.Slice(arr, len(bitmaps)), bitmaps)
		list = arr
	}
	var rc C.int32_t
	chunks := C.mf_mtmd_tokenize(p.c, ctext, list, C.size_t(len(bitmaps)), &rc)
	if chunks == nil {
		if rc == 1 {
			return nil, errors.New("the prompt's image markers do not match its images")
		}
		return nil, fmt.Errorf("tokenizing the prompt with its images failed (%d)", int(rc))
	}
	defer C.mtmd_input_chunks_free(chunks)
	n := int(C.mtmd_input_chunks_size(chunks))
	out := make([]Piece, 0, n)
	for i := range n {
		ch := C.mtmd_input_chunks_get(chunks, C.size_t(i))
		switch C.mtmd_input_chunk_get_type(ch) {
		case C.MTMD_INPUT_CHUNK_TYPE_TEXT:
			var nt C.size_t
			toks := C.mtmd_input_chunk_get_tokens_text(ch, &nt)
			out = append(out, Piece{Tokens: append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(toks)), int(nt))...)})
		case C.MTMD_INPUT_CHUNK_TYPE_IMAGE:
			img := &ImageChunk{c: C.mtmd_input_chunk_copy(ch)}
			runtime.AddCleanup(img, func(c *C.mtmd_input_chunk) { C.mtmd_input_chunk_free(c) }, img.c)
			out = append(out, Piece{Image: img, NTokens: int(C.mtmd_input_chunk_get_n_tokens(ch))})
		default:
			return nil, errors.New("the prompt has media other than images")
		}
	}
	return out, nil
}

// EvalImage encodes img and decodes its embeddings into sequence seq of ctx from
// position pos on, nBatch positions per decode.
func (p *Projector) EvalImage(ctx *Context, img *ImageChunk, pos, seq, nBatch int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var next C.llama_pos
	rc := C.mtmd_helper_eval_chunk_single(p.c, ctx.c, img.c, C.llama_pos(pos), C.llama_seq_id(seq),
		C.int32_t(nBatch), false, &next)
	runtime.KeepAlive(img)
	if rc != 0 {
		return fmt.Errorf("evaluating an image failed (%d)", int(rc))
	}
	return nil
}

// Package estimate computes the memory a macfleet runner (llama.cpp) needs to serve a
// GGUF model from the model's header alone, read from a local file or over HTTP range
// requests (a few MiB of a multi-GiB file).
//
// The header comes from whoever published the model. Before the parser sees it, it
// is checked against Limits (internal/ggufheader: header size, key, tensor, string,
// array and layer counts), so that no declared count or length makes the caller
// allocate it; a remote header is read within the limits and the parser reads those
// same bytes from a mirror on loopback. Over a limit the estimate fails with a
// *ParseError wrapping a *ggufheader.LimitError that names the limit.
//
// The figure is what the runner allocates with every layer and the output offloaded
// to the GPU (Metal on a Mac; the CPU backend elsewhere), built from the header parsed
// by github.com/gpustack/gguf-parser-go:
//
//		Total = Weights + KVCache + Recurrent + Compute + Overhead
//
//	  - Weights: the model's tensors, each once (every expert of a mixture of
//	    experts: all are resident). A tied output projection (no
//	    output.weight) is the token embedding itself: llama.cpp's duplicate of it on
//	    the output device maps the same file pages (mmap, the runner's default on
//	    darwin) or is the same tensor (one CPU buffer).
//	  - KVCache: keys and values of every attention layer for ContextLength cells,
//	    2 × layers × kvHeads × headDim × contextLength × bytesPerElement (f16: 2; q8_0
//	    and q4_0: their block sizes), with the model's real KV head count (grouped-query
//	    attention). ContextLength is the *total* context shared by the Parallel slots —
//	    llama.cpp's n_ctx, of which each slot gets n_ctx/parallel cells, as the runner's
//	    --ctx — so parallel does not multiply the KV cache. llama.cpp pads n_ctx up to a
//	    multiple of 256 with flash attention (32 without); so does the estimate.
//	    Sliding-window layers count the whole context too (the runner keeps
//	    llama.cpp's full-size window cache); a hybrid's recurrent layers none.
//	  - Recurrent: a hybrid's per-sequence convolution and recurrent states of its
//	    recurrent layers, which parallel does multiply (families.go).
//	  - Compute: llama.cpp's compute buffer, which it reserves whole at load for its
//	    worst micro-batch — Batch tokens, every one an output, over the whole
//	    context: the inputs (embeddings, positions, the attention mask), the larger of
//	    one layer's activations and the logits, or the attention scores where flash
//	    attention is off, or a hybrid's delta-net layer where that is larger; and
//	    the metadata of the two graphs llama.cpp keeps.
//	  - Overhead: RunnerBaseline (the runner process itself), the header, the
//	    vocabulary tables and the output buffer — a row of logits and embeddings per
//	    output of the largest step the runner takes (api.EmbedChunk tokens per slot
//	    for an embedding input).
//
// Flash attention is assumed where llama.cpp turns it on by itself: always for a
// quantized KV cache (a quantized V cache needs it), and for f16 where Metal has a
// kernel for the head size. Without it the compute buffer holds the attention
// scores of a micro-batch (context × batch × heads f32), which the estimate counts.
//
// How it relates to what a runner measures: the estimate is meant to be at least the
// runner's peak footprint and at most 1.3× it. The tests check both bounds against the
// kernel's high-water mark of real runner processes (the CPU backend on Linux; that is
// what CI can measure) after a prompt that fills the context and an embedding input,
// for the synthesized presets and for models with grouped-query attention, an untied
// output, and Q8_0/Q4_0 weights: 1.10–1.22× (docs/benchmarks.md, "First estimates").
// The compute buffer is counted whole although the CPU backend's untouched pages are
// not resident, because Metal may hold all of it. The parser's own unified-memory
// figure, used before, came out 1.6–1.9× the measured peak: it counted a tied output
// twice, sized the output buffer for a whole batch of outputs, and added fixed load
// and scheduler allowances that RunnerBaseline, measured, already covers. Once a
// replica has loaded, the controller places further replicas of the same template by
// the footprint the agent measured (ModelReplica status.memory) instead.
package estimate

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	gguf "github.com/gpustack/gguf-parser-go"

	"github.com/macfleet/macfleet/internal/modelsource"
)

// KVCacheType is the element type of the KV cache.
type KVCacheType string

const (
	KVF16  KVCacheType = "f16"
	KVQ8_0 KVCacheType = "q8_0"
	KVQ4_0 KVCacheType = "q4_0"
)

// Params says which model to estimate and how the engine will run it.
type Params struct {
	// URL is an http(s) URL serving the GGUF file; Path a GGUF file on the local disk.
	// Exactly one must be set.
	URL  string
	Path string

	// ContextLength is the total context in tokens, shared by the Parallel slots; 0
	// means the model's training context.
	ContextLength int32
	// Parallel is the number of sequences decoded together; 0 means 1.
	Parallel int32
	// KVCacheType is the KV element type; empty means f16.
	KVCacheType KVCacheType
	// Batch is the runner's n_batch, the most tokens it decodes per step; 0 means
	// DefaultBatch.
	Batch int32

	// Header is added to every request for URL (e.g. Authorization for a gated repo).
	Header http.Header
	// HTTPClient makes the range requests that read the header from URL (its
	// CheckRedirect and TLS settings apply); nil means a client with a 30 s timeout.
	HTTPClient *http.Client
	// Dial, when set, makes every connection of those requests instead of
	// HTTPClient's own dialer (a policy-checked dialer); its first error is the
	// estimate's.
	Dial DialFunc
}

// Dims are the model's hyperparameters that the engine pool needs (its prefill guard
// sizes KV growth per token from them).
type Dims struct {
	Architecture string
	// Layers is the number of transformer blocks.
	Layers int64
	// Heads and KVHeads are the attention and key/value head counts.
	Heads, KVHeads int64
	// HeadDimK and HeadDimV are the key and value head sizes.
	HeadDimK, HeadDimV int64
	// Embd is the embedding width.
	Embd int64
	// Vocab is the vocabulary size.
	Vocab int64
	// CtxTrain is the context length the model was trained with.
	CtxTrain int64
	// Params is the number of parameters.
	Params int64
}

// Result is the memory estimate for one engine serving the model.
type Result struct {
	// Total is the memory to reserve: Weights + KVCache + Recurrent + Compute +
	// Overhead.
	Total int64
	// Weights are the model's tensors, each counted once.
	Weights int64
	// KVCache is the keys and values of ContextLength cells.
	KVCache int64
	// Recurrent is a hybrid's recurrent state: per sequence, the convolution and
	// recurrent state of each of its recurrent layers (families.go).
	Recurrent int64
	// Compute is llama.cpp's compute buffer: the inputs, activations and logits of
	// its worst-case micro-batch, and the graph's metadata.
	Compute int64
	// Overhead is RunnerBaseline, the header, the vocabulary tables and the output
	// buffer.
	Overhead int64
	// Projector is a multimodal projector's memory beside the model (WithProjector):
	// counted in Total, 0 for a model without one.
	Projector int64
	// Draft is a draft model's memory beside the model (WithDraft): its weights, its
	// KV cache for every slot and its compute buffer, counted in Total, 0 without one.
	Draft int64
	// GreedyHead is what this model adds as a draft on the CPU: its greedy head's copy
	// of the output matrix (draft.go); not in Total, counted by DraftBytes.
	GreedyHead int64

	// ContextLength is the context the KV cache was sized for, after padding.
	ContextLength int64
	// Parallel is the number of sequences the estimate assumed; Batch the n_batch.
	Parallel int32
	Batch    int32
	// KVCacheType is the KV element type the estimate assumed.
	KVCacheType KVCacheType
	// FlashAttention says whether the estimate assumed flash attention.
	FlashAttention bool

	// FileSize is the size of the GGUF file (all shards).
	FileSize int64
	// Dims are the model's hyperparameters.
	Dims Dims
}

// NotGGUFError is a file that does not start with the GGUF magic. It never carries
// the file's bytes: its message ends up in status, and the bytes are not the
// reader's to show.
type NotGGUFError struct {
	Location string
}

func (e *NotGGUFError) Error() string {
	return fmt.Sprintf("%s is not a GGUF file (it does not start with the GGUF magic)", e.Location)
}

// NoRangeError is a server that does not answer range requests, so the header could
// only be read by downloading the whole file.
type NoRangeError struct {
	URL string
}

func (e *NoRangeError) Error() string {
	return fmt.Sprintf("%s does not support HTTP range requests: the GGUF header cannot be read without downloading the model; set resources.memory", e.URL)
}

// ParseError is a GGUF file whose header could not be parsed (truncated or corrupt).
type ParseError struct {
	Location string
	Err      error
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("parsing the GGUF header of %s: %v", e.Location, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }

// UnsupportedModelError is a GGUF file that is not a language model llama.cpp serves
// on its own (a projector, an adapter, an imatrix) or lacks the attention
// hyperparameters.
type UnsupportedModelError struct {
	Location     string
	Type         string
	Architecture string
	Reason       string
}

func (e *UnsupportedModelError) Error() string {
	return fmt.Sprintf("%s: %s (type %q, architecture %q)", e.Location, e.Reason, e.Type, e.Architecture)
}

// ParamsError is an invalid Params.
type ParamsError struct{ Reason string }

func (e *ParamsError) Error() string { return "invalid estimate parameters: " + e.Reason }

// readBufferSize is the first range request's size (later ones double it up to 8×),
// so a header of a few hundred KiB costs one request.
const readBufferSize = 1 << 20

// Estimate reads the GGUF header at p.URL or p.Path and returns llama.cpp's memory
// needs for p's engine settings. Failures are typed: *modelsource.UnreachableError,
// *modelsource.StatusError, *NotGGUFError, *NoRangeError, *ParseError (wrapping a
// *ggufheader.LimitError for a header over Limits), *UnsupportedModelError,
// *ParamsError, or a wrapped os error for a local path.
func Estimate(ctx context.Context, p Params) (Result, error) {
	h, err := ReadHeader(ctx, p)
	if err != nil {
		return Result{}, err
	}
	return h.Estimate(p)
}

// Header is a GGUF header read and checked once, to estimate the model at several
// engine settings (a ladder of contexts) without reading it again.
type Header struct {
	gf  *gguf.GGUFFile
	loc string
}

// ReadHeader reads the GGUF header at p.URL or p.Path as Estimate does, with the same
// typed errors; p's engine settings are checked but not used.
func ReadHeader(ctx context.Context, p Params) (*Header, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	var (
		gf  *gguf.GGUFFile
		err error
	)
	if p.Path != "" {
		gf, err = parseLocal(p.Path)
	} else {
		gf, err = parseRemote(ctx, p)
	}
	if err != nil {
		return nil, err
	}
	return &Header{gf: gf, loc: p.location()}, nil
}

// Estimate is the model's memory for p's engine settings (ContextLength, Parallel,
// KVCacheType, Batch); p's URL, Path and transport fields are not used.
func (h *Header) Estimate(p Params) (Result, error) {
	p.URL, p.Path = "", h.loc
	if err := p.validate(); err != nil {
		return Result{}, err
	}
	r, err := safeCompute(h.gf, h.loc, p)
	if err == nil {
		r.GreedyHead = greedyHeadBytes(h.gf)
	}
	return r, err
}

// safeCompute is compute, turning the estimator's panics (it indexes tables by what
// the header declares) into *ParseError: a header that passed the limits may still
// describe a model no estimator can make sense of.
func safeCompute(gf *gguf.GGUFFile, loc string, p Params) (r Result, err error) {
	defer func() {
		if x := recover(); x != nil {
			r, err = Result{}, &ParseError{Location: loc, Err: fmt.Errorf("the estimator panicked on this header: %v", x)}
		}
	}()
	return compute(gf, loc, p)
}

func (p Params) location() string {
	if p.Path != "" {
		return p.Path
	}
	return p.URL
}

func (p Params) validate() error {
	switch {
	case (p.URL == "") == (p.Path == ""):
		return &ParamsError{Reason: "exactly one of URL and Path must be set"}
	case p.ContextLength < 0:
		return &ParamsError{Reason: fmt.Sprintf("contextLength %d is negative", p.ContextLength)}
	case p.Parallel < 0:
		return &ParamsError{Reason: fmt.Sprintf("parallel %d is negative", p.Parallel)}
	case p.Batch < 0:
		return &ParamsError{Reason: fmt.Sprintf("batch %d is negative", p.Batch)}
	}
	if _, err := p.KVCacheType.ggml(); err != nil {
		return err
	}
	return nil
}

func (t KVCacheType) ggml() (gguf.GGMLType, error) {
	switch t {
	case "", KVF16:
		return gguf.GGMLTypeF16, nil
	case KVQ8_0:
		return gguf.GGMLTypeQ8_0, nil
	case KVQ4_0:
		return gguf.GGMLTypeQ4_0, nil
	}
	return 0, &ParamsError{Reason: fmt.Sprintf("unknown KV cache type %q (want f16, q8_0 or q4_0)", t)}
}

// parseLocal checks the header of the file at path (and its other shards) against
// Limits, then parses it.
func parseLocal(path string) (*gguf.GGUFFile, error) {
	if err := checkLocal(path); err != nil {
		return nil, err
	}
	return parse(path, func() (*gguf.GGUFFile, error) {
		return gguf.ParseGGUFFile(path, gguf.SkipLargeMetadata())
	})
}

// parseRemote reads the header at p.URL within Limits (fetchHeader), then has the
// parser read those bytes from a mirror on loopback. A header whose read fails
// midway is read again, up to remoteAttempts times: one dropped connection would
// otherwise leave the deployment unplaceable until its spec changed.
func parseRemote(ctx context.Context, p Params) (*gguf.GGUFFile, error) {
	cli := headerClient(p)
	fetch := func(ctx context.Context, u string) (*remoteHeader, error) {
		var (
			h   *remoteHeader
			err error
		)
		for attempt := 1; attempt <= remoteAttempts; attempt++ {
			h, err = fetchHeader(ctx, cli, p.Header, u)
			var ue *modelsource.UnreachableError
			if err == nil || !errors.As(err, &ue) || attempt == remoteAttempts {
				break
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("reading the GGUF header of %s: %w", u, ctx.Err())
			case <-time.After(time.Duration(attempt) * remoteRetryDelay):
			}
		}
		return h, err
	}
	first, err := fetch(ctx, p.URL)
	if err != nil {
		return nil, err
	}
	m, err := startMirror(ctx, p.URL, first, fetch)
	if err != nil {
		return nil, err
	}
	defer m.close()
	gf, err := parse(p.URL, func() (*gguf.GGUFFile, error) {
		return gguf.ParseGGUFFileRemote(ctx, m.URL(), gguf.SkipLargeMetadata(), gguf.UseBufferSize(readBufferSize),
			gguf.SkipCache(), gguf.SkipProxy())
	})
	if ferr := m.fetchErr(); err != nil && ferr != nil {
		return nil, ferr
	}
	return gf, err
}

// parse runs the parser, turning its errors and panics (it panics on some corrupt
// headers) into *ParseError.
func parse(loc string, f func() (*gguf.GGUFFile, error)) (gf *gguf.GGUFFile, err error) {
	defer func() {
		if r := recover(); r != nil {
			gf, err = nil, &ParseError{Location: loc, Err: fmt.Errorf("parser panicked: %v", r)}
		}
	}()
	gf, err = f()
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		return nil, &ParseError{Location: loc, Err: err}
	}
	return gf, nil
}

var defaultClient = &http.Client{Timeout: 30 * time.Second}

// remoteAttempts is how often a remote header is read before a parse error stands;
// remoteRetryDelay, times the attempt, is the wait between two reads.
const (
	remoteAttempts   = 3
	remoteRetryDelay = 200 * time.Millisecond
)

// deniedError is the source policy's refusal inside a transport error, or nil.
func deniedError(err error) error {
	var de *modelsource.DeniedError
	if errors.As(err, &de) {
		return de
	}
	return nil
}

func compute(gf *gguf.GGUFFile, loc string, p Params) (Result, error) {
	a := gf.Architecture()
	if a.Type != "model" {
		return Result{}, &UnsupportedModelError{Location: loc, Type: a.Type, Architecture: a.Architecture,
			Reason: "not a language model llama.cpp can serve on its own"}
	}
	if a.BlockCount == 0 || a.EmbeddingLength == 0 {
		return Result{}, &UnsupportedModelError{Location: loc, Type: a.Type, Architecture: a.Architecture,
			Reason: "the header lacks block_count or embedding_length"}
	}
	kvType, _ := p.KVCacheType.ggml()
	parallel := max(p.Parallel, 1)
	batch := p.Batch
	if batch <= 0 {
		batch = DefaultBatch
	}
	opts := []gguf.GGUFRunEstimateOption{
		gguf.WithParallelSize(parallel),
		gguf.WithLLaMACppCacheKeyType(kvType),
		gguf.WithLLaMACppCacheValueType(kvType),
		gguf.WithLLaMACppLogicalBatchSize(batch),
		gguf.WithLLaMACppPhysicalBatchSize(batch),
	}
	// The runner leaves llama.cpp's swa_full on: a window layer's cache is full-size.
	opts = append(opts, gguf.WithLLaMACppFullSizeSWACache())
	if kvType != gguf.GGMLTypeF16 || metalFlashAttention(a.AttentionKeyLength) {
		opts = append(opts, gguf.WithFlashAttention())
	}
	if p.ContextLength > 0 {
		opts = append(opts, gguf.WithLLaMACppContextSize(p.ContextLength))
	}
	e := gf.EstimateLLaMACppRun(opts...)

	var r Result
	// Every tensor once: a tied output projection is the token embedding's own file
	// pages (mmap) or the same tensor (one CPU buffer), never a second copy.
	r.Weights = int64(gf.ModelSize)
	r.KVCache, r.Recurrent = modelState(a, e, kvType, int64(parallel))
	r.Compute = computeBuffer(gf, e, batch)
	r.Overhead = RunnerBaseline + int64(gf.Size-gf.ModelSize) + vocabTables(gf) +
		outputBuffer(int64(a.VocabularyLength), int64(a.EmbeddingLength), int64(parallel), int64(batch))
	r.Total = r.Weights + r.KVCache + r.Recurrent + r.Compute + r.Overhead
	r.ContextLength = int64(e.ContextSize)
	r.Parallel, r.Batch = parallel, batch
	r.KVCacheType = p.KVCacheType
	if r.KVCacheType == "" {
		r.KVCacheType = KVF16
	}
	r.FlashAttention = e.FlashAttention
	r.FileSize = int64(gf.Size)
	r.Dims = Dims{
		Architecture: a.Architecture,
		Layers:       int64(a.BlockCount),
		Heads:        int64(a.AttentionHeadCount),
		KVHeads:      int64(a.AttentionHeadCountKV),
		HeadDimK:     int64(a.AttentionKeyLength),
		HeadDimV:     int64(a.AttentionValueLength),
		Embd:         int64(a.EmbeddingLength),
		Vocab:        int64(a.VocabularyLength),
		CtxTrain:     int64(a.MaximumContextLength),
		Params:       int64(gf.ModelParameters),
	}
	return r, nil
}

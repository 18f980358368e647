//go:build cgo && !race

package llama

// Contexts: the KV cache and compute buffers of a loaded model, the batches decoded
// into them, and the sequence state saved from and restored into them.

/*
#include <stdlib.h>
#include "llama.h"
#include "ggml-cpu.h"
#include "greedyhead.h"

static void mf_stop_at_norm_set(struct llama_context_params *p, mf_stop *stop) {
	p->cb_eval = mf_stop_at_norm;
	p->cb_eval_user_data = stop;
}

static struct ggml_threadpool *mf_threadpool_new(int n) {
	struct ggml_threadpool_params p = ggml_threadpool_params_default(n);
	return ggml_threadpool_new(&p);
}

static void mf_batch_set(struct llama_batch *b, int i, llama_token tok, llama_pos pos, llama_seq_id seq, _Bool output) {
	b->token[i] = tok;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = seq;
	b->logits[i] = output;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// ContextParams configures NewContext.
type ContextParams struct {
	// NCtx is the total context in cells, split evenly across NSeqMax sequences.
	NCtx int
	// NBatch is the most tokens one Decode may carry (larger batches abort the process).
	NBatch int
	// NSeqMax is the number of sequences (slots).
	NSeqMax int
	// Threads is the number of CPU threads.
	Threads int
	// KVType is the KV cache element type: f16, q8_0 or q4_0.
	KVType string
	// Embeddings makes every output row carry its embedding as well as its logits.
	Embeddings bool
	// StopAtNorm makes every output row carry its hidden state (its embedding) and
	// lets the caller end each decode at the final norm (SetStopAtNorm; off at first),
	// skipping the output projection: for a greedy head (GreedyHead) that needs no
	// logits.
	StopAtNorm bool
	// ThreadsOf, when set, makes the context compute on that context's thread pool
	// instead of a pool of its own: for a context that never decodes at the same time
	// as it (a draft model's beside its target). Two pools on the same cores each
	// keep their threads spinning for a while after their own step, and the other's
	// step then runs on cores they hold.
	ThreadsOf *Context
}

// KVTypeSize is the size in bytes of one KV element of type t (block-averaged).
func KVTypeSize(t string) (float64, error) {
	switch t {
	case "", "f16":
		return 2, nil
	case "q8_0":
		return 34.0 / 32, nil
	case "q4_0":
		return 18.0 / 32, nil
	}
	return 0, fmt.Errorf("unknown KV cache type %q (want f16, q8_0 or q4_0)", t)
}

func kvType(t string) (C.enum_ggml_type, error) {
	switch t {
	case "", "f16":
		return C.GGML_TYPE_F16, nil
	case "q8_0":
		return C.GGML_TYPE_Q8_0, nil
	case "q4_0":
		return C.GGML_TYPE_Q4_0, nil
	}
	return 0, fmt.Errorf("unknown KV cache type %q (want f16, q8_0 or q4_0)", t)
}

// Context is an inference context: the KV cache and compute buffers.
type Context struct {
	c     *C.struct_llama_context
	tp    *C.struct_ggml_threadpool
	mem   C.llama_memory_t
	model *Model
	nEmbd int
	// stop is StopAtNorm's switch (C memory: the graph callback reads it), nil without.
	stop *C.mf_stop
}

// NewContext creates a context for m. Each sequence gets its own KV stream of
// NCtx/NSeqMax cells, so sequences never compete for cells.
func NewContext(m *Model, p ContextParams) (*Context, error) {
	kt, err := kvType(p.KVType)
	if err != nil {
		return nil, err
	}
	cp := C.llama_context_default_params()
	cp.n_ctx = C.uint32_t(p.NCtx)
	cp.n_batch = C.uint32_t(p.NBatch)
	cp.n_ubatch = C.uint32_t(p.NBatch)
	cp.n_seq_max = C.uint32_t(p.NSeqMax)
	cp.n_threads = C.int32_t(p.Threads)
	cp.n_threads_batch = C.int32_t(p.Threads)
	cp.type_k = kt
	cp.type_v = kt
	cp.embeddings = C._Bool(p.Embeddings || p.StopAtNorm)
	var stop *C.mf_stop
	if p.StopAtNorm {
		stop = (*C.mf_stop)(C.calloc(1, C.size_t(unsafe.Sizeof(C.mf_stop{}))))
		C.mf_stop_at_norm_set(&cp, stop)
	}
	cp.kv_unified = false
	if kt != C.GGML_TYPE_F16 {
		// A quantized V cache needs flash attention.
		cp.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED
	}
	c := C.llama_init_from_model(m.c, cp)
	if c == nil {
		C.free(unsafe.Pointer(stop))
		return nil, errors.New("llama.cpp could not create a context (see its log on stderr)")
	}
	ctx := &Context{c: c, mem: C.llama_get_memory(c), model: m, nEmbd: m.NEmbd(), stop: stop}
	// One thread pool for the context's life. Without it every llama_decode starts
	// and joins its own threads (a disposable pool per graph), which costs each step a
	// thread start and leaves the threads cold; on a busy host the new threads also
	// queue behind everything else before the step can begin.
	if o := p.ThreadsOf; o != nil && o.tp != nil {
		C.llama_attach_threadpool(c, o.tp, o.tp) // o's to free
	} else if ctx.tp = C.mf_threadpool_new(C.int(max(p.Threads, 1))); ctx.tp != nil {
		C.llama_attach_threadpool(c, ctx.tp, ctx.tp)
	}
	return ctx, nil
}

// Free releases the context (KV cache and compute buffers).
func (c *Context) Free() {
	if c.c != nil {
		C.llama_free(c.c)
		c.c = nil
	}
	if c.tp != nil {
		C.ggml_threadpool_free(c.tp)
		c.tp = nil
	}
	if c.stop != nil {
		C.free(unsafe.Pointer(c.stop))
		c.stop = nil
	}
}

// NCtx is the total number of KV cells.
func (c *Context) NCtx() int { return int(C.llama_n_ctx(c.c)) }

// NCtxSeq is the number of KV cells of one sequence.
func (c *Context) NCtxSeq() int { return int(C.llama_n_ctx_seq(c.c)) }

// NBatch is the most tokens one Decode accepts.
func (c *Context) NBatch() int { return int(C.llama_n_batch(c.c)) }

// NSeqMax is the number of sequences.
func (c *Context) NSeqMax() int { return int(C.llama_n_seq_max(c.c)) }

// Synchronize waits for the context's backends to finish what Decode started: a
// split runner's network devices compute asynchronously and report a failure found
// then on the link (metal/runner/netdevice), which the caller checks after it.
func (c *Context) Synchronize() { C.llama_synchronize(c.c) }

// ErrNoKVSlot is returned by Decode when the KV cache has no room for the batch.
var ErrNoKVSlot = errors.New("no KV cache slot for the batch")

// Decode runs the model over the batch. The caller must have checked that the batch
// holds at most NBatch tokens and that every sequence stays within NCtxSeq positions:
// llama.cpp aborts the process otherwise.
func (c *Context) Decode(b *Batch) error {
	if b.N() == 0 {
		return errors.New("empty batch")
	}
	if b.N() > c.NBatch() {
		return fmt.Errorf("batch of %d tokens exceeds n_batch %d", b.N(), c.NBatch())
	}
	switch r := C.llama_decode(c.c, b.c); {
	case r == 0:
		return nil
	case r == 1:
		return ErrNoKVSlot
	default:
		return fmt.Errorf("llama_decode failed (%d)", int(r))
	}
}

// SeqRm removes positions [p0, p1) of seq (p1 < 0: to the end). Removing a whole
// sequence never fails.
func (c *Context) SeqRm(seq, p0, p1 int) bool {
	return bool(C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), C.llama_pos(p0), C.llama_pos(p1)))
}

// SeqPosMax is the largest position of seq in the cache, -1 when empty.
func (c *Context) SeqPosMax(seq int) int {
	return int(C.llama_memory_seq_pos_max(c.mem, C.llama_seq_id(seq)))
}

// ClearMemory drops every sequence from the KV cache.
func (c *Context) ClearMemory() { C.llama_memory_clear(c.mem, true) }

// SeqStateSize is the size in bytes of the serialized KV state of seq.
func (c *Context) SeqStateSize(seq int) int {
	return int(C.llama_state_seq_get_size(c.c, C.llama_seq_id(seq)))
}

// SeqState returns prefix followed by the serialized KV state of seq, written straight
// into the returned slice (no intermediate C copy: states of long contexts are large).
func (c *Context) SeqState(seq int, prefix []byte) []byte {
	n := C.llama_state_seq_get_size(c.c, C.llama_seq_id(seq))
	out := make([]byte, len(prefix)+int(n))
	copy(out, prefix)
	if n == 0 {
		return out
	}
	got := C.llama_state_seq_get_data(c.c, (*C.uint8_t)(unsafe.Pointer(&out[len(prefix)])), n, C.llama_seq_id(seq))
	return out[:len(prefix)+int(got)]
}

// SetSeqState restores a state returned by SeqState (without its prefix) into seq,
// replacing what seq held. On failure seq is left empty.
func (c *Context) SetSeqState(seq int, state []byte) error {
	if len(state) == 0 {
		return errors.New("empty sequence state")
	}
	// llama.cpp only reads the buffer during the call: no copy into C memory needed.
	if C.llama_state_seq_set_data(c.c, (*C.uint8_t)(unsafe.Pointer(&state[0])), C.size_t(len(state)), C.llama_seq_id(seq)) == 0 {
		C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), -1, -1)
		return errors.New("llama.cpp rejected the sequence state")
	}
	return nil
}

// AddEmbedding adds the embedding of output row i (batch index) to dst, which has
// NEmbd elements; it reports false when the row has no embedding.
func (c *Context) AddEmbedding(dst []float32, i int) bool {
	e := C.llama_get_embeddings_ith(c.c, C.int32_t(i))
	if e == nil {
		return false
	}
	for j, v := range unsafe.Slice((*float32)(unsafe.Pointer(e)), c.nEmbd) {
		dst[j] += v
	}
	return true
}

// Batch is a reusable token batch. Each token belongs to one sequence.
type Batch struct {
	c   C.struct_llama_batch
	cap int
}

// NewBatch allocates a batch of up to n tokens.
func NewBatch(n int) *Batch {
	return &Batch{c: C.llama_batch_init(C.int32_t(n), 0, 1), cap: n}
}

// Free releases the batch.
func (b *Batch) Free() {
	if b.cap > 0 {
		C.llama_batch_free(b.c)
		b.cap = 0
	}
}

// N is the number of tokens in the batch.
func (b *Batch) N() int { return int(b.c.n_tokens) }

// Cap is the batch capacity.
func (b *Batch) Cap() int { return b.cap }

// Clear empties the batch.
func (b *Batch) Clear() { b.c.n_tokens = 0 }

// Add appends a token at pos of seq and returns its index in the batch; output asks
// for its logits (and embedding). It panics when the batch is full: callers size
// their batches.
func (b *Batch) Add(tok int32, pos, seq int, output bool) int {
	i := int(b.c.n_tokens)
	if i >= b.cap {
		panic("llama: batch overflow")
	}
	C.mf_batch_set(&b.c, C.int(i), C.llama_token(tok), C.llama_pos(pos), C.llama_seq_id(seq), C._Bool(output))
	b.c.n_tokens++
	return i
}

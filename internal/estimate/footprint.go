package estimate

import (
	gguf "github.com/gpustack/gguf-parser-go"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// DefaultBatch is the runner's n_batch (and n_ubatch) when Params.Batch is 0: its
// --batch default.
const DefaultBatch = 512

// RunnerBaseline is the memory a runner process holds whatever its model: its code,
// the C++ runtime, ggml's backend and scheduler state, the Go runtime and thread
// stacks. Measured on Linux (CPU backend): a runner serving the 2 MiB tiny model
// holds about 21 MiB resident once its weights, KV cache and buffers are taken
// away, and up to 3 MiB more on a busy machine (the full make test measured the tiny
// model's runner at a 37.5 MiB peak where an idle machine measures 34.3 MiB: more
// threads, and their allocator arenas); the tests check that this figure keeps the
// estimate at or above every measured peak. Without it a small model's reservation
// sits below what its runner measures, and the runner's own ceiling (the
// reservation plus 10%) refuses prompts.
const RunnerBaseline = 28 << 20

// metalFlashAttention says whether llama.cpp's Metal backend has a flash-attention
// kernel for this key head size (its supports_op list). llama.cpp enables flash
// attention on its own (flash_attn auto) when every attention layer's device has one;
// the CPU backend always does.
func metalFlashAttention(headDim uint32) bool {
	switch headDim {
	case 32, 40, 48, 64, 72, 80, 96, 112, 128, 192, 256, 576:
		return true
	}
	return false
}

// computeBuffer is llama.cpp's compute buffer: the graph it reserves for the worst
// micro-batch — n_batch tokens, every one an output, over the whole context — whose
// tensors the allocator packs into one buffer, allocated whole at load. It is the
// larger of the parser's two views of that graph (with every layer offloaded, one
// device runs all of it): the host's inputs (embeddings, positions, attention
// mask) plus the largest of one layer's activations, a hybrid's delta-net layer's
// and the output logits; and the offload device's inputs plus its attention (the
// score matrix when flash attention is off). Plus the metadata of llama.cpp's two
// graphs (graphMeta).
func computeBuffer(gf *gguf.GGUFFile, e gguf.LLaMACppRunEstimate, batch int32) int64 {
	a := gf.Architecture()
	tokens := min(int64(e.ContextSize), int64(batch))
	host := e.Devices[0].Computation
	layer := int64(max(host.Compute, host.Output))
	if h, ok := hybridOf(a); ok {
		layer = max(layer, h.deltaNetCompute(tokens))
	}
	c := int64(host.Input) + layer
	for _, d := range e.Devices[1:] {
		c = max(c, int64(d.Computation.Input+d.Computation.Compute))
	}
	return c + graphMeta(graphNodes(a.Architecture, int64(len(gf.TensorInfos)), tokens))
}

// modelState is the KV cache and recurrent state: the parser's KV cache (with every
// window layer full-size), or for a hybrid whose layer split llama.cpp fixes, the
// KV cache of its attention layers and the recurrent state of the others.
func modelState(a gguf.GGUFArchitecture, e gguf.LLaMACppRunEstimate, kvType gguf.GGMLType, seqs int64) (kv, recurrent int64) {
	if h, ok := hybridOf(a); ok {
		s := kvShape{KVHeads: int64(a.AttentionHeadCountKV), KeyLength: int64(a.AttentionKeyLength),
			ValueLength: int64(a.AttentionValueLength)}
		return s.kvCache(h.attentionLayers(), int64(e.ContextSize), kvType), h.recurrentState(seqs)
	}
	for _, d := range e.Devices {
		kv += int64(d.KVCache.Sum())
	}
	return kv, 0
}

// vocabTables is the memory of llama.cpp's vocabulary: per token its type and score,
// its string and an entry in the token-to-id map; per BPE merge a map entry.
func vocabTables(gf *gguf.GGUFFile) int64 {
	t := gf.Tokenizer()
	return int64(t.TokensLength*(4+4+32+24+32) + t.MergesLength*(48+56))
}

// outputBuffer is llama.cpp's output buffer (host memory whatever the backend): a
// row of logits and one of embeddings (the runner's context has embeddings on) per
// output of the largest step. A generating slot outputs one row per step; an
// embedding input outputs every token, and the runner feeds those runnerapi.EmbedChunk
// tokens per slot per step, within n_batch. llama.cpp grows the buffer to the most
// rows it has seen and never shrinks it.
func outputBuffer(vocab, embd, parallel, batch int64) int64 {
	return outputRows(parallel, batch) * outputRowBytes(vocab, embd)
}

// outputRows is the most rows the output buffer of a context of parallel slots holds.
func outputRows(parallel, batch int64) int64 {
	return max(parallel, min(batch, parallel*runnerapi.EmbedChunk))
}

// outputRowBytes is one output row: its logits and its embedding, in float32.
func outputRowBytes(vocab, embd int64) int64 {
	return (vocab + embd) * 4
}

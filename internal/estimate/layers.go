package estimate

import "math"

// Layered is how an estimate divides over the model's layers, for a replica split
// across Macs: each shard holds a contiguous range of transformer blocks.
//
// The model: the weights outside the blocks are the token embeddings and the output
// layer, Vocab × Embd parameters each at the model's mean bytes per parameter (a tied
// output is counted twice, erring towards the head); the rest of the weights, the
// whole KV cache and a hybrid's recurrent state divide evenly over the blocks (every
// block of a decoder holds the same tensors and the same share of the cache; a
// hybrid's blocks hold either a share of the cache or a recurrent state, which this
// evens out). The head (shard 0) also holds the
// compute buffer and the overhead (runner baseline, header, vocabulary tables, output
// buffer); every other shard runs a worker process with its own baseline and a
// compute buffer for its blocks, bounded by the head's.
type Layered struct {
	// Layers is the number of blocks.
	Layers int64
	// PerLayer is one block's weights and KV cache, rounded up.
	PerLayer int64
	// Head is what shard 0 needs besides its blocks.
	Head int64
	// Worker is what every other shard needs besides its blocks.
	Worker int64
	// Compute is the compute buffer of one llama context, counted in Head and in
	// Worker once: a pipelined split head (engine splitPipeline) and its workers hold
	// one per context (Pipelined).
	Compute int64
	// Parallel, Batch and OutputRow size the head's output buffers (Pipelined): the
	// engine's sequences and n_batch, and the bytes of one output row.
	Parallel, Batch, OutputRow int64
}

// Pipelined is what a split head decoding in n llama contexts (engine splitPipeline,
// each of Parallel/n sequences) and each of its workers need beyond the one context
// Head and Worker count. Each of them holds n−1 more compute buffers, each counted
// at the whole engine's (the attention part of a context of fewer cells is smaller:
// this errs high). The head also holds one output buffer per context: n buffers of
// Parallel/n sequences' rows, which exceed the one of Parallel sequences when Batch
// bounds the latter (a row per embedding input token, up to Batch a step).
func (l Layered) Pipelined(n int) (head, worker int64) {
	if n <= 1 {
		return 0, 0
	}
	worker = int64(n-1) * max(l.Compute, 0)
	head = worker
	if l.Parallel > 0 && l.Batch > 0 && l.OutputRow > 0 {
		per := max(l.Parallel/int64(n), 1)
		head += max(int64(n)*outputRows(per, l.Batch)-outputRows(l.Parallel, l.Batch), 0) * l.OutputRow
	}
	return head, worker
}

// ByLayer divides the estimate over the model's layers. Head + Layers × PerLayer is
// Total, up to Layers − 1 bytes of rounding above it; ok is false when the header
// gave no layers.
func (r Result) ByLayer() (l Layered, ok bool) {
	if r.Dims.Layers <= 0 {
		return Layered{}, false
	}
	var outside int64
	if r.Dims.Params > 0 && r.Dims.Vocab > 0 && r.Dims.Embd > 0 {
		perParam := float64(r.Weights) / float64(r.Dims.Params)
		outside = int64(math.Ceil(2 * float64(r.Dims.Vocab) * float64(r.Dims.Embd) * perParam))
	}
	// The blocks hold at least half the weights: a header whose vocabulary dwarfs the
	// model is not believed further.
	outside = min(max(outside, 0), r.Weights/2)
	inBlocks := r.Weights - outside + r.KVCache + r.Recurrent
	l = Layered{
		Layers:   r.Dims.Layers,
		PerLayer: (inBlocks + r.Dims.Layers - 1) / r.Dims.Layers,
		Head:     outside + r.Compute + r.Overhead,
		Worker:   RunnerBaseline + r.Compute,
		Compute:  r.Compute,
		Parallel: int64(r.Parallel),
		Batch:    int64(r.Batch),
	}
	if r.Dims.Vocab > 0 && r.Dims.Embd > 0 {
		l.OutputRow = outputRowBytes(r.Dims.Vocab, r.Dims.Embd)
	}
	return l, true
}

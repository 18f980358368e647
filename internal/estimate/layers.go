package estimate

import "math"

// Layered is how an estimate divides over the model's layers, for a replica split
// across Macs: each shard holds a contiguous range of transformer blocks.
//
// The model: the weights outside the blocks are the token embeddings and the output
// layer, Vocab × Embd parameters each at the model's mean bytes per parameter (a tied
// output is counted twice, erring towards the head); the rest of the weights and the
// whole KV cache divide evenly over the blocks (every block of a decoder holds the
// same tensors and the same share of the cache). The head (shard 0) also holds the
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
	// one per context.
	Compute int64
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
	inBlocks := r.Weights - outside + r.KVCache
	l = Layered{
		Layers:   r.Dims.Layers,
		PerLayer: (inBlocks + r.Dims.Layers - 1) / r.Dims.Layers,
		Head:     outside + r.Compute + r.Overhead,
		Worker:   RunnerBaseline + r.Compute,
		Compute:  r.Compute,
	}
	return l, true
}

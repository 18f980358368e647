package estimate

import (
	gguf "github.com/gpustack/gguf-parser-go"
)

// What a model family allocates beyond a dense model's weights, KV cache and compute
// buffer, as the vendored llama.cpp does it for the runner's context:
//
//   - Experts: every expert's tensors are resident (mapped or read), not only the ones
//     a token uses; they are tensors of the file, so Weights (the sum of every tensor)
//     counts them all.
//   - Sliding-window layers: the runner leaves llama.cpp's swa_full on (its default),
//     so a window layer's cache holds the whole context like a global layer's; the
//     estimate sizes it so.
//   - A hybrid (Qwen3-Next): llama.cpp fixes every fourth layer as attention and the
//     others as gated delta-net layers, whether or not the header says so. Only the
//     attention layers hold a KV cache; every delta-net layer holds, per sequence
//     (parallel slot), a convolution state of (convKernel−1) × (innerSize + 2 ×
//     groups × stateSize) and a recurrent state of stateSize × innerSize values, both
//     f32. Its compute graph is sized for max(40 × batch, 32 × tensors) nodes, and a
//     delta-net layer's working set (its projections and the chunked attention
//     matrices of the whole micro-batch) can exceed an attention layer's.
//   - Every family: llama.cpp keeps two graph results (the one reserved and the
//     previous one), each with the metadata buffer of a whole graph.

// hybrid is a hybrid model's layer split and recurrent state, from its header.
type hybrid struct {
	// Layers is the number of blocks; Interval makes every Interval-th of them an
	// attention layer and the others recurrent.
	Layers, Interval int64
	// ConvKernel, InnerSize (value width), StateSize (head size) and Groups (key
	// heads) are the ssm.* keys; Heads (ssm.time_step_rank) the value heads.
	ConvKernel, InnerSize, StateSize, Groups, Heads int64
}

// fixedAttentionInterval is the attention interval llama.cpp fixes for a hybrid
// architecture whatever its header declares.
var fixedAttentionInterval = map[string]int64{"qwen3next": 4}

// hybridOf is a's hybrid shape, ok false for an architecture that is not one
// llama.cpp fixes the layer split of.
func hybridOf(a gguf.GGUFArchitecture) (h hybrid, ok bool) {
	interval, ok := fixedAttentionInterval[a.Architecture]
	if !ok {
		return hybrid{}, false
	}
	return hybrid{Layers: int64(a.BlockCount), Interval: interval, ConvKernel: int64(a.SSMConvolutionKernel),
		InnerSize: int64(a.SSMInnerSize), StateSize: int64(a.SSMStateSize), Groups: int64(a.SSMGroupCount),
		Heads: int64(a.SSMTimeStepRank)}, true
}

// attentionLayers is the number of layers with a KV cache.
func (h hybrid) attentionLayers() int64 {
	if h.Interval <= 0 {
		return h.Layers
	}
	return h.Layers / h.Interval
}

// recurrentLayers is the number of layers with a recurrent state.
func (h hybrid) recurrentLayers() int64 { return h.Layers - h.attentionLayers() }

// convRow and stateRow are one sequence's convolution and recurrent state of one
// layer, in values (llama.cpp's n_embd_r and n_embd_s).
func (h hybrid) convRow() int64 {
	return max(h.ConvKernel-1, 0) * (h.InnerSize + 2*h.Groups*h.StateSize)
}
func (h hybrid) stateRow() int64 { return h.StateSize * h.InnerSize }

// recurrentState is the f32 states of every recurrent layer for seqs sequences
// (llama.cpp keeps max(1, n_seq_max) cells, one per sequence).
func (h hybrid) recurrentState(seqs int64) int64 {
	return h.recurrentLayers() * max(seqs, 1) * (h.convRow() + h.stateRow()) * 4
}

// kvShape is the key and value widths of an attention layer.
type kvShape struct {
	KVHeads, KeyLength, ValueLength int64
}

// kvCache is the keys and values of layers attention layers for cells cells, each
// row of type t.
func (s kvShape) kvCache(layers, cells int64, t gguf.GGMLType) int64 {
	k := int64(t.RowSizeOf([]uint64{uint64(s.KeyLength * s.KVHeads * cells)}))
	v := int64(t.RowSizeOf([]uint64{uint64(s.ValueLength * s.KVHeads * cells)}))
	return layers * (k + v)
}

// deltaNetChunk is the chunk llama.cpp's delta-net graph splits a micro-batch into.
const deltaNetChunk = 64

// deltaNetCompute bounds a delta-net layer's working set for a micro-batch of tokens
// tokens: four f32 activations of its projections' width (queries, keys, values and
// the output gate: 2 × groups × stateSize + 2 × innerSize per token, live as the
// projection's output, the convolution's input and output and the padded copies)
// and four f32 chunk matrices of chunk × chunk per chunk and value head (the decay
// mask, the masked attention and its products).
func (h hybrid) deltaNetCompute(tokens int64) int64 {
	padded := (tokens + deltaNetChunk - 1) / deltaNetChunk * deltaNetChunk
	width := 2*h.Groups*h.StateSize + 2*h.InnerSize
	return 4*padded*width*4 + 4*deltaNetChunk*padded*max(h.Heads, 1)*4
}

// graphNodes is the node count llama.cpp sizes arch's compute graph for, a model of
// tensors tensors decoding micro-batches of tokens tokens.
func graphNodes(arch string, tensors, tokens int64) int64 {
	if _, ok := fixedAttentionInterval[arch]; ok {
		return max(40*tokens, 32*tensors)
	}
	return max(1024, 8*tensors)
}

// graphMeta is the metadata of llama.cpp's two graph results of nodes nodes each:
// per node a tensor's overhead, and the graph's node, leaf and hash tables.
func graphMeta(nodes int64) int64 {
	n := uint64(max(nodes, 0))
	return 2 * int64(gguf.GGMLTensorOverhead()*n+gguf.GGMLComputationGraphOverhead(n, false))
}

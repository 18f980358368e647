package estimate

import (
	"context"

	gguf "github.com/gpustack/gguf-parser-go"
)

// A draft model for speculative decoding (a smaller GGUF of the model's vocabulary)
// is loaded in its model's runner with a context shaped as the model's: the same
// context, slots, KV type and batch. It adds its own estimate to the runner's, but for
// the runner's baseline, which the model's estimate counts once.

// DraftBytes is what a draft model whose estimate for its model's engine settings is
// r adds to its model's runner: all of r but RunnerBaseline, and its greedy head
// (GreedyHead), which the runner holds where the draft computes on the CPU.
func (r Result) DraftBytes() int64 { return max(0, r.Total-RunnerBaseline) + r.GreedyHead }

// Draft reads the header of the draft model at p.URL or p.Path, as Estimate reads a
// model's, with p the model's engine settings, and returns the memory it adds to its
// model's runner (DraftBytes).
func Draft(ctx context.Context, p Params) (int64, error) {
	r, err := Estimate(ctx, p)
	if err != nil {
		return 0, err
	}
	return r.DraftBytes(), nil
}

// greedyHeadBytes is the memory of the greedy head a runner builds for the model of gf
// as a draft on the CPU (docs/speculative-decoding.md, "The draft model's head"): a
// copy of its output matrix (output.weight, else the tied token embedding) as int8
// values and a float scale for every 32, n_vocab × n_embd × 9/8 bytes, where that
// matrix is q8_0 and its embedding whole blocks of 32 up to 4096; 0 elsewhere. A draft
// on an accelerator builds none, but where it computes is chosen at load (beside a
// model on a GPU, where its step is shorter), so a draft's estimate counts it.
func greedyHeadBytes(gf *gguf.GGUFFile) int64 {
	var out *gguf.GGUFTensorInfo
	for i := range gf.TensorInfos {
		switch ti := &gf.TensorInfos[i]; ti.Name {
		case "output.weight":
			out = ti
		case "token_embd.weight":
			if out == nil {
				out = ti
			}
		}
	}
	if out == nil || out.Type != gguf.GGMLTypeQ8_0 || len(out.Dimensions) < 2 {
		return 0
	}
	embd, vocab := int64(out.Dimensions[0]), int64(out.Dimensions[1])
	if embd <= 0 || embd%32 != 0 || embd > 4096 {
		return 0
	}
	return vocab * embd * 9 / 8
}

// WithDraft is r with a draft model's memory (Draft) counted in Total.
func (r Result) WithDraft(bytes int64) Result {
	r.Total += bytes - r.Draft
	r.Draft = bytes
	return r
}

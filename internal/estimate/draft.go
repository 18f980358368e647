package estimate

import "context"

// A draft model for speculative decoding (a smaller GGUF of the model's vocabulary)
// is loaded in its model's runner with a context shaped as the model's: the same
// context, slots, KV type and batch. It adds its own estimate to the runner's, but for
// the runner's baseline, which the model's estimate counts once.

// DraftBytes is what a draft model whose estimate for its model's engine settings is
// r adds to its model's runner: all of r but RunnerBaseline.
func (r Result) DraftBytes() int64 { return max(0, r.Total-RunnerBaseline) }

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

// WithDraft is r with a draft model's memory (Draft) counted in Total.
func (r Result) WithDraft(bytes int64) Result {
	r.Total += bytes - r.Draft
	r.Draft = bytes
	return r
}

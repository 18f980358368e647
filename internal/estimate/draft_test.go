package estimate

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

func TestWithDraft(t *testing.T) {
	r := Result{Total: 1000, Weights: 600, Projector: 100}
	if r = r.WithDraft(300); r.Total != 1300 || r.Draft != 300 || r.Projector != 100 {
		t.Errorf("WithDraft(300): %+v", r)
	}
	if r = r.WithDraft(50); r.Total != 1050 || r.Draft != 50 {
		t.Errorf("WithDraft again replaces the first: %+v", r)
	}
	if got := (Result{Total: RunnerBaseline + 7}).DraftBytes(); got != 7 {
		t.Errorf("DraftBytes = %d, want the estimate but the runner's baseline (7)", got)
	}
	if got := (Result{Total: RunnerBaseline + 7, GreedyHead: 9}).DraftBytes(); got != 16 {
		t.Errorf("DraftBytes = %d, want the estimate but the runner's baseline and its greedy head (7 + 9)", got)
	}
}

// TestDraftReadsTheFile: a draft model's bytes are its own estimate for the model's
// engine settings but the runner's baseline: its KV cache grows with the slots.
func TestDraftReadsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.gguf")
	if err := ggufsynth.Write(path, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	one := Params{Path: path, ContextLength: 4096, Parallel: 1}
	four := Params{Path: path, ContextLength: 4 * 4096, Parallel: 4}
	r, err := Estimate(ctx, one)
	if err != nil {
		t.Fatal(err)
	}
	got1, err := Draft(ctx, one)
	if err != nil || got1 != r.Total-RunnerBaseline || r.Weights == 0 {
		t.Fatalf("Draft = %d, %v; its estimate is %+v", got1, err, r)
	}
	got4, err := Draft(ctx, four)
	if err != nil || got4-got1 < 3*r.KVCache {
		t.Fatalf("Draft for 4 slots = %d, %v; for one %d: want at least three more KV caches of %d", got4, err, got1, r.KVCache)
	}
	if _, err := Draft(ctx, Params{Path: filepath.Join(t.TempDir(), "missing.gguf")}); err == nil {
		t.Error("a missing draft estimated")
	}
}

// TestDraftCountsTheGreedyHead: a draft whose output matrix is q8_0 adds the greedy
// head's copy of it (n_vocab × n_embd × 9/8: the size the runner's /status reports as
// head_bytes), tied or untied; an f32 one adds none.
func TestDraftCountsTheGreedyHead(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		spec     func() ggufsynth.Spec
		withHead bool
	}{
		{"f32", ggufsynth.Tiny, false},
		{"q8_0 tied", func() ggufsynth.Spec { s := ggufsynth.Small(); s.DType = ggufsynth.Q8_0; return s }, true},
		{"q8_0 untied", func() ggufsynth.Spec {
			s := ggufsynth.Small()
			s.DType, s.Untied = ggufsynth.Q8_0, true
			return s
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec()
			path := filepath.Join(t.TempDir(), "d.gguf")
			if err := ggufsynth.Write(path, spec); err != nil {
				t.Fatal(err)
			}
			p := Params{Path: path, ContextLength: 4096, Parallel: 1}
			r, err := Estimate(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Draft(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			var want int64
			if tc.withHead {
				want = int64(r.Dims.Vocab) * int64(r.Dims.Embd) * 9 / 8
			}
			base := r.Total - RunnerBaseline
			if got-base != want || r.GreedyHead != want || (tc.withHead && want == 0) {
				t.Errorf("Draft = %d: the estimate but the baseline %d, plus %d (GreedyHead %d); want plus %d (the greedy head)",
					got, base, got-base, r.GreedyHead, want)
			}
		})
	}
}

// TestGreedyHeadPerFamily: every family the matrix synthesizes, stored as q8_0, has
// its greedy head counted at the size the runner's head holds where its embedding is
// whole 32-value blocks, and none where it is not.
func TestGreedyHeadPerFamily(t *testing.T) {
	for _, f := range ggufsynth.Families {
		t.Run(string(f), func(t *testing.T) {
			spec, err := ggufsynth.TinyFamily(f)
			if err != nil {
				t.Fatal(err)
			}
			spec.DType = ggufsynth.Q8_0
			path := filepath.Join(t.TempDir(), "d.gguf")
			if err := ggufsynth.Write(path, spec); err != nil {
				t.Fatal(err)
			}
			r, err := Estimate(context.Background(), Params{Path: path, ContextLength: 1024, Parallel: 1})
			if err != nil {
				t.Fatal(err)
			}
			var want int64
			if r.Dims.Embd%32 == 0 {
				want = r.Dims.Vocab * r.Dims.Embd * 9 / 8
			}
			if r.GreedyHead != want {
				t.Errorf("GreedyHead %d, want %d (vocabulary %d, embedding %d)", r.GreedyHead, want, r.Dims.Vocab, r.Dims.Embd)
			}
			t.Logf("vocabulary %d, embedding %d: greedy head %d bytes", r.Dims.Vocab, r.Dims.Embd, r.GreedyHead)
		})
	}
}

//go:build cgo && !race

package llama

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// TestGreedyHead: on the trained draft and test models (a tied q8_0 output matrix,
// embeddings of one and five blocks) and a synthesized model with an untied one, the
// head chooses at every token of a real text what the model's logits choose (or a
// token whose logit ties it), its vector and portable kernels choose alike, the head
// split among threads chooses as it does whole, and a
// decode stopped at the final norm gives the head the same hidden state as a whole
// one while the graph ends there.
func TestGreedyHead(t *testing.T) {
	var paths []string
	if p, ok := testassets.TrainedModelPath(); ok {
		paths = append(paths, p)
	}
	if p, ok, err := testassets.DraftModelPath(); err == nil && ok {
		paths = append(paths, p)
	}
	untied := ggufsynth.Small()
	untied.DType, untied.Untied = ggufsynth.Q8_0, true
	synth := filepath.Join(t.TempDir(), "untied-q8.gguf")
	if err := ggufsynth.Write(synth, untied); err != nil {
		t.Fatal(err)
	}
	paths = append(paths, synth)
	const text = "The tool read the file back, and the answer quotes it: every word where it was, in order."
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			m, err := LoadModel(path, ModelParams{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Free()
			g, err := LoadGreedyHead(path, m)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Free()
			if want := int64(m.NVocab()) * int64(m.NEmbd()) * 9 / 8; g.Bytes() != want {
				t.Errorf("head bytes %d, want %d (int8 values and a float scale per 32)", g.Bytes(), want)
			}
			ctx, err := NewContext(m, ContextParams{NCtx: 512, NBatch: 128, NSeqMax: 1, Threads: 2, StopAtNorm: true})
			if err != nil {
				t.Fatal(err)
			}
			defer ctx.Free()
			toks, err := m.Tokenize(text, true, false)
			if err != nil {
				t.Fatal(err)
			}
			b := NewBatch(128)
			defer b.Free()
			for i, tok := range toks {
				b.Add(tok, i, 0, true)
			}
			if err := ctx.Decode(b); err != nil {
				t.Fatal(err)
			}
			if ctx.NormStops() != 0 {
				t.Fatalf("%d graphs stopped before SetStopAtNorm", ctx.NormStops())
			}
			same := 0
			for i := range toks {
				l := ctx.Logits(i)
				want, got := l.Argmax(m), g.Argmax(ctx, i)
				if p := g.argmaxPortable(ctx, i); p != got {
					t.Errorf("token %d: the vector kernel chose %d, the portable one %d", i, got, p)
				}
				for _, n := range []int{2, 3, 8} {
					g.SetThreads(n)
					if s := g.Argmax(ctx, i); s != got {
						t.Errorf("token %d: the head split %d ways (%d asked) chose %d, whole %d", i, g.ways, n, s, got)
					}
				}
				g.SetThreads(1)
				if got == want {
					same++
					continue
				}
				w, h := float64(l.At(m, want)), float64(l.At(m, got))
				if got < 0 || h < w-1e-3*math.Max(1, math.Abs(w)) {
					t.Errorf("token %d: the head chose %d (logit %.4f), the logits %d (%.4f)", i, got, h, want, w)
				}
			}
			t.Logf("%d tokens: the head chose the logits' token at %d, a tie at the rest", len(toks), same)

			// The last token again, whole and then stopped at the norm.
			last := len(toks) - 1
			again := func(stop bool) int32 {
				ctx.SetStopAtNorm(stop)
				if !ctx.SeqRm(0, last, -1) {
					t.Fatal("the last token's cell could not be removed")
				}
				b.Clear()
				b.Add(toks[last], last, 0, true)
				if err := ctx.Decode(b); err != nil {
					t.Fatal(err)
				}
				return g.Argmax(ctx, 0)
			}
			whole := again(false)
			stops := ctx.NormStops()
			if stopped := again(true); stopped != whole {
				t.Errorf("stopped at the norm the head chose %d, after a whole decode %d", stopped, whole)
			}
			if ctx.NormStops() != stops+1 {
				t.Errorf("a decode with the stop on ended %d graphs at the norm, want 1", ctx.NormStops()-stops)
			}
		})
	}
}

// TestGreedyHeadRefused: a model whose output matrix is not q8_0 gets no head, and
// the error says why.
func TestGreedyHeadRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny-f32.gguf")
	if err := ggufsynth.Write(path, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	m, err := LoadModel(path, ModelParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if g, err := LoadGreedyHead(path, m); err == nil || !strings.Contains(err.Error(), "not q8_0") {
		g.Free()
		t.Fatalf("LoadGreedyHead of an f32 model: %v, want an error naming q8_0", err)
	}
}

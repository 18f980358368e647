package estimate

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// FuzzEstimateLocal: any file given as a model either fails with one of the
// estimator's typed errors or gives an estimate whose parts add up, never a panic (a
// GGUF header comes from whoever published the model).
func FuzzEstimateLocal(f *testing.F) {
	dir := f.TempDir()
	p := filepath.Join(dir, "tiny.gguf")
	if err := ggufsynth.Write(p, ggufsynth.Tiny()); err != nil {
		f.Fatal(err)
	}
	whole, err := os.ReadFile(p)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(whole[:32<<10]) // the header and tensor infos, without most of the weights
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := Estimate(t.Context(), Params{Path: path, ContextLength: 512})
		if err != nil {
			var (
				notGGUF *NotGGUFError
				parse   *ParseError
				unsup   *UnsupportedModelError
			)
			if !errors.As(err, &notGGUF) && !errors.As(err, &parse) && !errors.As(err, &unsup) {
				t.Fatalf("Estimate: %T %v, want a NotGGUFError, ParseError or UnsupportedModelError", err, err)
			}
			return
		}
		if r.Total <= 0 || r.Total != r.Weights+r.KVCache+r.Compute+r.Overhead {
			t.Fatalf("estimate %+v: the total is not the sum of its positive parts", r)
		}
	})
}

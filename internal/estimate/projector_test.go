package estimate

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

func TestProjectorBytes(t *testing.T) {
	for _, tc := range []struct{ weights, want int64 }{
		{0, ProjectorComputeMin},
		{100 << 20, 100<<20 + ProjectorComputeMin},
		{256 << 20, 256<<20 + 64<<20},
		{800 << 20, 800<<20 + 200<<20},
	} {
		if got := projectorBytes(tc.weights); got != tc.want {
			t.Errorf("projectorBytes(%d) = %d, want %d", tc.weights, got, tc.want)
		}
	}
	r := Result{Total: 1000, Weights: 600}
	r = r.WithProjector(300)
	if r.Total != 1300 || r.Projector != 300 {
		t.Errorf("WithProjector(300): %+v", r)
	}
	if r = r.WithProjector(100); r.Total != 1100 || r.Projector != 100 {
		t.Errorf("WithProjector again replaces the first: %+v", r)
	}
}

// TestProjectorReadsTheFile: a projector's bytes are its file's tensors and the
// encoder's headroom, read from the header of a GGUF file.
func TestProjectorReadsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.gguf")
	if err := ggufsynth.Write(path, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	h, err := ReadHeader(context.Background(), Params{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Projector(context.Background(), Params{Path: path})
	if err != nil || got != projectorBytes(int64(h.gf.ModelSize)) || h.gf.ModelSize == 0 {
		t.Errorf("Projector = %d, %v; its tensors are %d bytes", got, err, h.gf.ModelSize)
	}
	if _, err := Projector(context.Background(), Params{Path: filepath.Join(t.TempDir(), "missing.gguf")}); err == nil {
		t.Error("a missing projector estimated")
	}
}

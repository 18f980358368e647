package store

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gguf "github.com/gpustack/gguf-parser-go"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

func TestLayerRangeHeldBy(t *testing.T) {
	for _, tc := range []struct {
		lr    LayerRange
		names []string
		want  bool
	}{
		{LayerRange{0, 1}, []string{"blk.0.attn_q.weight"}, true},
		{LayerRange{2, 3}, []string{"blk.1.ffn_up.weight", "blk.3.ffn_down.weight"}, true},
		{LayerRange{2, 3}, []string{"blk.1.ffn_up.weight", "blk.4.attn_norm.weight"}, false},
		{LayerRange{10, 12}, []string{"blk.1.x", "blk.12.x"}, true},
		{LayerRange{10, 12}, []string{"blk.1.x", "blk.120.x", "blk.11"}, false},
		{LayerRange{0, 40}, []string{"token_embd.weight", "output_norm.weight", "output.weight"}, false},
		{LayerRange{0, 40}, []string{"blk.x.weight", "blk..weight", "blk.-1.weight"}, false},
		{LayerRange{0, 40}, nil, false},
	} {
		if got := tc.lr.heldBy(tc.names); got != tc.want {
			t.Errorf("%+v held by %q: %v, want %v", tc.lr, tc.names, got, tc.want)
		}
	}
}

// TestFetchLayersFetchesOnlyItsParts: a split worker's fetch of a model stored in
// three parts downloads the first part and those holding its layers (as an
// independent GGUF parser reads the parts), names only those beside the first, and
// asks the others for their header only.
func TestFetchLayersFetchesOnlyItsParts(t *testing.T) {
	spec := ggufsynth.Tiny()
	spec.Layers = 4
	paths, err := ggufsynth.WriteParts(filepath.Join(t.TempDir(), "m"), spec, 3)
	if err != nil {
		t.Fatal(err)
	}
	h := newHubParts(t)
	var tensors [][]string
	for i, p := range paths {
		h.parts[partName(i+1)] = readFile(t, p)
		// Under a name of no part: the parser would read every part of the model.
		alone := filepath.Join(t.TempDir(), "alone.gguf")
		if err := os.WriteFile(alone, h.parts[partName(i+1)], 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.ParseGGUFFile(alone)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, ti := range f.TensorInfos {
			names = append(names, ti.Name)
		}
		tensors = append(tensors, names)
	}
	// holds is what the test expects of part i: the first, or a tensor of a layer in lr.
	holds := func(i int, lr LayerRange) bool {
		for _, n := range tensors[i] {
			for l := lr.First; l <= lr.Last; l++ {
				if strings.HasPrefix(n, fmt.Sprintf("blk.%d.", l)) {
					return true
				}
			}
		}
		return i == 0
	}
	skipped := 0
	for _, lr := range []LayerRange{{0, 0}, {3, 3}, {2, 3}, {0, 3}} {
		before := len(h.requests())
		s := newStore(t, t.TempDir(), h.origin)
		p, err := s.FetchLayers(t.Context(), testNS, partsSource, "", lr, nil)
		if err != nil {
			t.Fatalf("layers %+v: %v", lr, err)
		}
		whole := map[string]bool{}
		for _, r := range h.requests()[before:] {
			if r.Range == "" {
				whole[filepath.Base(r.Path)] = true
			}
		}
		for i := range paths {
			name := partName(i + 1)
			want := holds(i, lr)
			b, err := os.ReadFile(filepath.Join(filepath.Dir(p), name))
			switch {
			case want && (err != nil || !bytes.Equal(b, h.parts[name])):
				t.Errorf("layers %+v: part %d beside the first: %v, want the hub's file", lr, i+1, err)
			case !want && err == nil:
				t.Errorf("layers %+v: part %d, which holds none of them, is named beside the first", lr, i+1)
			}
			if whole[name] != want {
				t.Errorf("layers %+v: part %d downloaded %v, want %v (requests %+v)", lr, i+1, whole[name], want, h.requests()[before:])
			}
			if !want {
				skipped++
			}
		}
	}
	if skipped == 0 {
		t.Errorf("every layer range needed every part: the parts %q test no selection", tensors)
	}
}

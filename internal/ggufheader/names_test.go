package ggufheader

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestTensorNamesOfParts: the names each part of a model stored in parts declares,
// together, are the tensors of the model in one file, each in one part, the layers in
// order across the parts; a header a limit forbids or an empty name is refused as
// Scan refuses it.
func TestTensorNamesOfParts(t *testing.T) {
	dir := t.TempDir()
	one := filepath.Join(dir, "one.gguf")
	if err := ggufsynth.Write(one, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	parts, err := ggufsynth.WriteParts(filepath.Join(dir, "tiny"), ggufsynth.Tiny(), 3)
	if err != nil {
		t.Fatal(err)
	}
	names := func(p string) []string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		n, err := TensorNames(bytes.NewReader(b), DefaultLimits)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return n
	}
	want := names(one)
	var got []string
	for _, p := range parts {
		n := names(p)
		if len(n) == 0 {
			t.Errorf("%s declares no tensor", filepath.Base(p))
		}
		got = append(got, n...)
	}
	if len(want) < 4 || !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("the parts declare %q, the one file %q", got, want)
	}
	if first := names(parts[0]); !strings.HasPrefix(first[0], "blk.0.") {
		t.Errorf("the first part starts with %q, want the first layer's tensors", first[0])
	}

	lim := DefaultLimits
	lim.MaxTensors = 1
	var le *LimitError
	if _, err := TensorNames(bytes.NewReader(new(ggufsynth.Raw).Tensor("a", 0, 4).Tensor("b", 0, 4).Bytes()), lim); !errors.As(err, &le) {
		t.Errorf("two tensors under a limit of one: %v, want a LimitError", err)
	}
	var fe *FormatError
	if _, err := TensorNames(bytes.NewReader(new(ggufsynth.Raw).Tensor("", 0, 4).Bytes()), DefaultLimits); !errors.As(err, &fe) {
		t.Errorf("an empty tensor name: %v, want a FormatError", err)
	}
}

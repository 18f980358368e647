package ggufheader

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	gguf "github.com/gpustack/gguf-parser-go"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

func TestScanRefusesWhatALimitForbids(t *testing.T) {
	small := Limits{MaxHeaderBytes: 4096, MaxKVs: 8, MaxTensors: 4, MaxStringBytes: 64, MaxArrayLen: 16, MaxBlockCount: 512}
	raw := func() *ggufsynth.Raw { return new(ggufsynth.Raw) }
	for _, tc := range []struct {
		name      string
		header    []byte
		wantLimit string // "" means no LimitError
		wantFmt   bool
	}{
		{"fits", raw().String("general.architecture", "llama").Uint32("llama.block_count", 512).
			ArrayLen("tokens", ggufsynth.RawUint32, 16, make([]byte, 64)).Tensor("w", 0, 4, 4).Bytes(), "", false},
		{"string length", raw().StringLen("general.name", 3<<30, nil).Bytes(), "string length", false},
		{"key length", raw().StringLen(string(make([]byte, 65)), 1, []byte("x")).Bytes(), "string length", false},
		{"array length", raw().ArrayLen("llama.feed_forward_length", ggufsynth.RawUint32, 1<<40, nil).Bytes(), "array length", false},
		{"metadata key count", (&ggufsynth.Raw{DeclaredKVs: 1 << 40}).Bytes(), "metadata key count", false},
		{"tensor count", (&ggufsynth.Raw{DeclaredTensors: 1 << 40}).Bytes(), "tensor count", false},
		{"split.tensors.count", raw().Uint64("split.tensors.count", 1<<40).Bytes(), "tensor count", false},
		{"block count", raw().Uint64("llama.block_count", 1<<35).Bytes(), "block count", false},
		{"float block count", raw().Float32("llama.block_count", 1e12).Bytes(), "block count", false},
		{"header size", raw().ArrayLen("a", ggufsynth.RawUint64, 16, make([]byte, 128)).
			ArrayLen("b", ggufsynth.RawUint64, 16, make([]byte, 128)).
			ArrayLen("c", ggufsynth.RawUint64, 16, make([]byte, 128)).Bytes(), "header size",
			false},
		{"truncated", raw().String("general.architecture", "llama").Bytes()[:30], "", true},
		{"array of arrays", raw().ArrayLen("a", ggufsynth.RawArray, 1, make([]byte, 12)).Bytes(), "", true},
		{"empty key", raw().Uint32("", 1).Bytes(), "", true},
		{"empty string value", raw().String("general.name", "").Bytes(), "", true},
		{"empty tensor name", raw().Tensor("", 0, 4).Bytes(), "", true},
		{"five dimensions", raw().Tensor("w", 0, 1, 1, 1, 1, 1).Bytes(), "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := small
			if tc.name == "header size" {
				lim.MaxHeaderBytes = 300
			}
			n, err := Scan(bytes.NewReader(tc.header), lim)
			var le *LimitError
			var fe *FormatError
			switch {
			case tc.wantLimit != "":
				if !errors.As(err, &le) || le.Limit != tc.wantLimit {
					t.Fatalf("Scan: %v, want a LimitError on the %s", err, tc.wantLimit)
				}
			case tc.wantFmt:
				if !errors.As(err, &fe) {
					t.Fatalf("Scan: %v, want a FormatError", err)
				}
			default:
				if err != nil || n != int64(len(tc.header)) {
					t.Fatalf("Scan = %d, %v; want %d, nil", n, err, len(tc.header))
				}
			}
		})
	}
}

// TestScanMeasuresARealHeader: the length Scan returns is where the parser's padding
// starts, for a model the synthesizer writes.
func TestScanMeasuresARealHeader(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := ggufsynth.Write(p, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := Scan(f, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	gf, err := gguf.ParseGGUFFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := gf.TensorDataStartOffset - gf.Padding; n != want {
		t.Fatalf("Scan = %d, want %d (the parser's header end)", n, want)
	}
}

func TestLimitErrorNamesTheLimit(t *testing.T) {
	_, err := Scan(bytes.NewReader(new(ggufsynth.Raw).StringLen("general.name", 3<<30, nil).Bytes()), DefaultLimits)
	want := `the GGUF header declares a string length of 3221225472 (key "general.name"), over the limit of 16777216: the file is corrupt or crafted, no published model comes near it`
	if err == nil || err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

package ggufheader

import (
	"bytes"
	"errors"
	"testing"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// FuzzScan: whatever the bytes, Scan returns a header length within the bytes it
// was given and the limit, or one of its typed errors, never a panic.
func FuzzScan(f *testing.F) {
	f.Add(new(ggufsynth.Raw).String("general.architecture", "llama").Uint32("llama.block_count", 2).
		ArrayLen("tokenizer.ggml.tokens", ggufsynth.RawString, 2, []byte("\x01\x00\x00\x00\x00\x00\x00\x00a\x01\x00\x00\x00\x00\x00\x00\x00b")).
		Tensor("token_embd.weight", 0, 4, 4).Bytes())
	f.Add(new(ggufsynth.Raw).StringLen("general.name", 3<<30, nil).Bytes())
	f.Add((&ggufsynth.Raw{DeclaredTensors: 1 << 40}).Bytes())
	lim := Limits{MaxHeaderBytes: 1 << 16, MaxKVs: 64, MaxTensors: 64, MaxStringBytes: 1 << 12, MaxArrayLen: 1 << 12, MaxBlockCount: 64}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := Scan(bytes.NewReader(data), lim)
		if err != nil {
			var (
				le *LimitError
				fe *FormatError
			)
			if !errors.Is(err, ErrNotGGUF) && !errors.As(err, &le) && !errors.As(err, &fe) {
				t.Fatalf("Scan: %T %v, want ErrNotGGUF, a LimitError or a FormatError", err, err)
			}
			if le != nil && le.Declared <= le.Max {
				t.Fatalf("%v: the declared figure is within the limit", le)
			}
			return
		}
		if n > int64(len(data)) || n > lim.MaxHeaderBytes {
			t.Fatalf("Scan = %d for %d bytes (limit %d)", n, len(data), lim.MaxHeaderBytes)
		}
	})
}

package ggufsynth

import (
	"fmt"
	"io"
	"os"

	"github.com/ollama/ollama/fs/ggml"
)

// alignment is where GGUF tensor data starts (general.alignment, not written: the
// default).
const alignment = 32

// WriteHeader writes the header of the model spec describes (its metadata and
// tensor descriptions) into path, as a sparse file of the model's full size whose
// weights are never written: for what reads only the header, such as a memory
// estimate of a shape too large to synthesize on a small machine. Loading it gives
// zero weights.
func WriteHeader(path string, spec Spec) error {
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("invalid model spec: %w", err)
	}
	ts := tensors(spec)
	for _, t := range ts {
		t.WriterTo = nothing{}
	}
	return writeAtomic(path, func(f *os.File) error {
		if err := ggml.WriteGGUF(f, metadata(spec), ts); err != nil {
			return err
		}
		// WriteGGUF wrote the tensor descriptions up to here and set each tensor's
		// offset from the aligned start of the data.
		end, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return err
		}
		data := (end + alignment - 1) / alignment * alignment
		size := data
		for _, t := range ts {
			size = max(size, data+int64(t.Offset+t.Size()))
		}
		return f.Truncate(size)
	})
}

// nothing writes no weights.
type nothing struct{}

func (nothing) WriteTo(io.Writer) (int64, error) { return 0, nil }

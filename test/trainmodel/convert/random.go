package convert

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/x448/float16"
)

// Defaults are train.py's default dimensions (DEFAULTS in weights.py;
// TestDefaultsMatchWeightsPy keeps them equal).
var Defaults = Hyperparameters{Vocab: 128256, Embd: 160, Layers: 8, Heads: 5, KVHeads: 1, FF: 512, Ctx: 32768,
	RopeTheta: 500000, NormEps: NormEps}

// fileLimit is the most bytes train.py puts in one weight file.
const fileLimit = 15 << 20

// WriteRandom writes random weights of h's shapes into dir in train.py's layout
// (manifest.json and weight files of at most 15 MiB, a tensor spanning files where
// it must): what the converter's tests convert in place of trained ones.
func WriteRandom(dir string, h Hyperparameters, seed uint64) error {
	m := Manifest{Format: Format, Hyperparameters: h, Training: json.RawMessage(`{"fake": true}`)}
	spec, err := m.Spec()
	if err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(seed, 0))
	w := &partWriter{dir: dir, used: fileLimit}
	for _, name := range tensorOrder(h) {
		shape := reverse(spec.TensorShapes()[name])
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]byte, 2*n)
		scale := float32(1)
		if len(shape) == 2 {
			scale = float32(1 / math.Sqrt(float64(shape[1])))
		}
		for i := range n {
			v := scale // norms: all ones
			if len(shape) == 2 {
				v = (2*r.Float32() - 1) * scale
			}
			binary.LittleEndian.PutUint16(data[2*i:], float16.Fromfloat32(v).Bits())
		}
		parts, err := w.write(data)
		if err != nil {
			return err
		}
		m.Tensors = append(m.Tensors, Tensor{Name: name, Shape: shape, DType: "f16", Bytes: int64(len(data)), Parts: parts})
	}
	if err := w.close(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644)
}

// tensorOrder is the order train.py writes the tensors in.
func tensorOrder(h Hyperparameters) []string {
	names := []string{"token_embd.weight", "output_norm.weight"}
	for i := range h.Layers {
		for _, n := range []string{"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"} {
			names = append(names, fmt.Sprintf("blk.%d.%s.weight", i, n))
		}
	}
	return names
}

// partWriter spreads bytes over weight files of at most fileLimit bytes.
type partWriter struct {
	dir  string
	f    *os.File
	n    int
	used int64
}

func (w *partWriter) write(data []byte) ([]Part, error) {
	var parts []Part
	for len(data) > 0 {
		if w.used == fileLimit {
			if err := w.close(); err != nil {
				return nil, err
			}
			f, err := os.Create(filepath.Join(w.dir, fmt.Sprintf("weights-%03d.bin", w.n)))
			if err != nil {
				return nil, err
			}
			w.f, w.n, w.used = f, w.n+1, 0
		}
		k := min(int64(len(data)), fileLimit-w.used)
		if _, err := w.f.Write(data[:k]); err != nil {
			return nil, err
		}
		parts = append(parts, Part{File: filepath.Base(w.f.Name()), Offset: w.used, Bytes: k})
		w.used += k
		data = data[k:]
	}
	return parts, nil
}

func (w *partWriter) close() error {
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

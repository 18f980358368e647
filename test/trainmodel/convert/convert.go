// Package convert writes the GGUF of the trained test model from the weights
// test/trainmodel/train.py saves: a manifest and raw little-endian float16 tensors.
// The vocabulary, merges, token types and chat template come from the module cache
// at conversion time (testassets), as in every model the tests synthesize; only the
// numbers come from training.
package convert

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/x448/float16"

	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// Format names the manifest's layout; train.py writes it.
const Format = "macfleet-trained-weights/1"

// Manifest describes the trained weights (manifest.json).
type Manifest struct {
	Format          string          `json:"format"`
	Hyperparameters Hyperparameters `json:"hyperparameters"`
	// Training is what train.py records of the run (seed, steps, losses); kept as is.
	Training json.RawMessage `json:"training,omitempty"`
	Tensors  []Tensor        `json:"tensors"`
}

// Hyperparameters are the model's dimensions and the settings the GGUF repeats.
type Hyperparameters struct {
	Vocab     int     `json:"vocab"`
	Embd      int     `json:"embd"`
	Layers    int     `json:"layers"`
	Heads     int     `json:"heads"`
	KVHeads   int     `json:"kvHeads"`
	FF        int     `json:"ff"`
	Ctx       int     `json:"ctx"`
	RopeTheta float32 `json:"ropeTheta"`
	NormEps   float32 `json:"normEps"`
}

// Tensor is one tensor: its GGUF name, its shape in PyTorch's order (rows first;
// GGUF lists dimensions the other way round) and the parts of the weight files that
// hold its float16 values, in order.
type Tensor struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
	DType string `json:"dtype"`
	Bytes int64  `json:"bytes"`
	Parts []Part `json:"parts"`
}

// Part is a stretch of a weight file.
type Part struct {
	File   string `json:"file"`
	Offset int64  `json:"offset"`
	Bytes  int64  `json:"bytes"`
}

// NormEps is the RMS norm epsilon every synthesized model is written with; train.py
// trains with it.
const NormEps = 1e-5

// ReadManifest reads and checks dir/manifest.json.
func ReadManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", filepath.Join(dir, "manifest.json"), err)
	}
	if m.Format != Format {
		return nil, fmt.Errorf("manifest format %q, want %q", m.Format, Format)
	}
	if m.Hyperparameters.NormEps != NormEps {
		return nil, fmt.Errorf("trained with norm epsilon %g, the GGUF is written with %g", m.Hyperparameters.NormEps, NormEps)
	}
	return &m, nil
}

// Spec is the model the manifest describes, with the Llama 3 vocabulary and chat
// template, its matrices stored as q8_0.
func (m *Manifest) Spec() (ggufsynth.Spec, error) {
	spec, err := testassets.Llama31Spec()
	if err != nil {
		return spec, err
	}
	h := m.Hyperparameters
	if h.Vocab != spec.Vocab {
		return spec, fmt.Errorf("trained with a vocabulary of %d tokens, the Llama 3 vocabulary has %d", h.Vocab, spec.Vocab)
	}
	spec.Name, spec.Seed = "macfleet-tiny-chat-trained", 0
	spec.Embd, spec.Layers, spec.Heads, spec.KVHeads, spec.FF, spec.Ctx = h.Embd, h.Layers, h.Heads, h.KVHeads, h.FF, h.Ctx
	spec.RopeBase, spec.DType = h.RopeTheta, ggufsynth.Q8_0
	spec.Untied = slices.ContainsFunc(m.Tensors, func(t Tensor) bool { return t.Name == "output.weight" })
	return spec, nil
}

// Convert writes the GGUF of the weights in dir to out.
func Convert(dir, out string) error {
	spec, err := Load(dir)
	if err != nil {
		return err
	}
	return ggufsynth.Write(out, spec)
}

// Load is the model of the weights in dir, ready for ggufsynth.Write.
func Load(dir string) (ggufsynth.Spec, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return ggufsynth.Spec{}, err
	}
	spec, err := m.Spec()
	if err != nil {
		return spec, err
	}
	if err := m.check(spec.TensorShapes()); err != nil {
		return spec, err
	}
	spec.Trained = map[string][]float32{}
	for _, t := range m.Tensors {
		if spec.Trained[t.Name], err = readTensor(dir, t); err != nil {
			return spec, err
		}
	}
	return spec, nil
}

// check compares the manifest's tensors with the model's, by name and shape,
// before any weight is read.
func (m *Manifest) check(shapes map[string][]uint64) error {
	seen := map[string]bool{}
	for _, t := range m.Tensors {
		want, ok := shapes[t.Name]
		switch {
		case !ok:
			return fmt.Errorf("tensor %s is not a tensor of a llama model of these dimensions", t.Name)
		case seen[t.Name]:
			return fmt.Errorf("tensor %s is listed twice", t.Name)
		case !reversed(t.Shape, want):
			return fmt.Errorf("tensor %s has shape %v, want %v (PyTorch order: rows first)", t.Name, t.Shape, reverse(want))
		}
		seen[t.Name] = true
	}
	for name := range shapes {
		if !seen[name] {
			return fmt.Errorf("the weights have no tensor %s", name)
		}
	}
	return nil
}

// readTensor reads one tensor's float16 values.
func readTensor(dir string, t Tensor) ([]float32, error) {
	n := int64(1)
	for _, d := range t.Shape {
		if d <= 0 {
			return nil, fmt.Errorf("tensor %s has shape %v", t.Name, t.Shape)
		}
		n *= int64(d)
	}
	if t.DType != "f16" {
		return nil, fmt.Errorf("tensor %s is %q, want f16", t.Name, t.DType)
	}
	if t.Bytes != 2*n {
		return nil, fmt.Errorf("tensor %s has %d bytes for shape %v, want %d", t.Name, t.Bytes, t.Shape, 2*n)
	}
	raw := make([]byte, 0, t.Bytes)
	for _, p := range t.Parts {
		if int64(len(raw))+p.Bytes > t.Bytes || p.Bytes <= 0 || p.Offset < 0 {
			return nil, fmt.Errorf("tensor %s: part %+v does not fit its %d bytes", t.Name, p, t.Bytes)
		}
		b, err := readPart(dir, p)
		if err != nil {
			return nil, fmt.Errorf("tensor %s: %w", t.Name, err)
		}
		raw = append(raw, b...)
	}
	if int64(len(raw)) != t.Bytes {
		return nil, fmt.Errorf("tensor %s: its parts hold %d bytes, want %d", t.Name, len(raw), t.Bytes)
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float16.Frombits(binary.LittleEndian.Uint16(raw[2*i:])).Float32()
	}
	return v, nil
}

// readPart reads a stretch of one of the weight files of dir.
func readPart(dir string, p Part) ([]byte, error) {
	if p.File == "" || filepath.Base(p.File) != p.File || p.File == ".." || p.File == "." {
		return nil, fmt.Errorf("%q is not a file of the weights' directory", p.File)
	}
	f, err := os.Open(filepath.Join(dir, p.File))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, p.Bytes)
	if _, err := f.ReadAt(b, p.Offset); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%d bytes at %d run past the end of %s", p.Bytes, p.Offset, p.File)
		}
		return nil, err
	}
	return b, nil
}

// reversed reports whether shape (PyTorch order) is ggml's order reversed.
func reversed(shape []int, ggml []uint64) bool {
	r := reverse(ggml)
	return slices.Equal(shape, r)
}

func reverse(ggml []uint64) []int {
	out := make([]int, len(ggml))
	for i, d := range ggml {
		out[len(ggml)-1-i] = int(d)
	}
	return out
}

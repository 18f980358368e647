package ggufsynth

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	parser "github.com/gpustack/gguf-parser-go"
	"github.com/x448/float16"
)

// dequantize reads one block back as ggml does: Q8_0 d·q, Q4_0 d·(nibble−8).
func dequantize(t *testing.T, dt DType, b []byte) []float32 {
	t.Helper()
	d := float16.Frombits(uint16(b[0]) | uint16(b[1])<<8).Float32()
	out := make([]float32, blockSize)
	for j := range blockSize {
		switch dt {
		case Q8_0:
			out[j] = d * float32(int8(b[2+j]))
		case Q4_0:
			nib := b[2+j%16] & 0x0f
			if j >= 16 {
				nib = b[2+j%16] >> 4
			}
			out[j] = d * (float32(nib) - 8)
		}
	}
	return out
}

// Every value comes back within half a quantization step (one step for Q4_0, whose
// positive end is clamped a step short), plus what rounding the scale to f16 costs
// (a relative 2^-11 on up to 127 steps: under a tenth of a step).
func TestQuantizedBlocksRoundTrip(t *testing.T) {
	w := &weights{n: 128 * blockSize, scale: 0.5, state: 42}
	var from uint64
	for _, dt := range []DType{Q8_0, Q4_0} {
		for range 64 {
			var x [blockSize]float32
			w.values(x[:], from)
			from += blockSize
			var amax float32
			for i := range x {
				amax = max(amax, float32(math.Abs(float64(x[i]))))
			}
			var b []byte
			tol := 0.6 * amax / 127
			if dt == Q8_0 {
				b = appendQ8_0(nil, &x)
			} else {
				b, tol = appendQ4_0(nil, &x), 1.1*amax/8
			}
			if want := 2 + blockSize*map[DType]int{Q8_0: 2, Q4_0: 1}[dt]/2; len(b) != want {
				t.Fatalf("%s block is %d bytes, want %d", dt, len(b), want)
			}
			for i, v := range dequantize(t, dt, b) {
				if diff := math.Abs(float64(v - x[i])); diff > float64(tol) {
					t.Fatalf("%s value %d: %g came back as %g (tolerance %g)", dt, i, x[i], v, tol)
				}
			}
		}
	}
}

// Quantized models store every matrix in the type and keep the norms f32; an
// untied model has its own output projection.
func TestQuantizedAndUntiedModels(t *testing.T) {
	for _, tc := range []struct {
		dtype  DType
		untied bool
		bytes  func(elems int64) int64
	}{
		{Q8_0, false, func(n int64) int64 { return n / 32 * 34 }},
		{Q4_0, true, func(n int64) int64 { return n / 32 * 18 }},
		{F16, true, func(n int64) int64 { return 2 * n }},
	} {
		spec := Tiny()
		spec.DType, spec.Untied = tc.dtype, tc.untied
		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := Write(path, spec); err != nil {
			t.Fatal(err)
		}
		gf, err := parser.ParseGGUFFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var out bool
		var elems, matrixBytes int64
		for _, ti := range gf.TensorInfos {
			n := int64(ti.Elements())
			elems += n
			if strings.HasSuffix(ti.Name, "norm.weight") {
				if ti.Type != parser.GGMLTypeF32 {
					t.Errorf("%s %s is %s, want F32", tc.dtype, ti.Name, ti.Type)
				}
				continue
			}
			out = out || ti.Name == "output.weight"
			matrixBytes += int64(ti.Bytes())
			if want := map[DType]parser.GGMLType{Q8_0: parser.GGMLTypeQ8_0, Q4_0: parser.GGMLTypeQ4_0, F16: parser.GGMLTypeF16}[tc.dtype]; ti.Type != want {
				t.Errorf("%s %s is %s, want %s", tc.dtype, ti.Name, ti.Type, want)
			}
		}
		norms := int64(spec.Embd) * int64(1+2*spec.Layers)
		if elems != spec.Params() || out != tc.untied {
			t.Errorf("%s untied=%v: %d elements (Params %d), output.weight present %v", tc.dtype, tc.untied, elems, spec.Params(), out)
		}
		if want := tc.bytes(spec.Params() - norms); matrixBytes != want {
			t.Errorf("%s matrices take %d bytes, want %d", tc.dtype, matrixBytes, want)
		}
	}
}

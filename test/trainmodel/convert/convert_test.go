package convert

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	parser "github.com/gpustack/gguf-parser-go"
	"github.com/x448/float16"

	"github.com/macfleet/macfleet/test/support/testassets"
)

// small is a model of the Llama 3 vocabulary with the fewest weights q8_0 allows.
var small = Hyperparameters{Vocab: 128256, Embd: 32, Layers: 1, Heads: 2, KVHeads: 1, FF: 64, Ctx: 4096,
	RopeTheta: 500000, NormEps: NormEps}

// TestConvert converts random weights in train.py's layout: every tensor lands under
// its name with llama.cpp's dimensions (reversed), matrices as q8_0 holding the
// values row by row, norms as f32; the vocabulary, template and rotary base are the
// ones training assumed, and the output projection is the token embedding.
func TestConvert(t *testing.T) {
	dir := t.TempDir()
	if err := WriteRandom(dir, small, 3); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "model.gguf")
	if err := Convert(dir, out); err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	gf, err := parser.ParseGGUFFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(gf.TensorInfos) != len(m.Tensors) {
		t.Fatalf("%d tensors in the GGUF, %d in the manifest", len(gf.TensorInfos), len(m.Tensors))
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range gf.TensorInfos {
		var mt *Tensor
		for i := range m.Tensors {
			if m.Tensors[i].Name == ti.Name {
				mt = &m.Tensors[i]
			}
		}
		if mt == nil {
			t.Fatalf("GGUF tensor %s is not in the manifest", ti.Name)
		}
		if len(ti.Dimensions) != len(mt.Shape) || int(ti.Dimensions[0]) != mt.Shape[len(mt.Shape)-1] {
			t.Errorf("%s: GGUF dimensions %v for PyTorch shape %v", ti.Name, ti.Dimensions, mt.Shape)
		}
		want, err := readTensor(dir, *mt)
		if err != nil {
			t.Fatal(err)
		}
		data := raw[gf.TensorDataStartOffset+int64(ti.Offset):]
		switch {
		case len(mt.Shape) == 1 && ti.Type == parser.GGMLTypeF32:
			for i, w := range want {
				if got := math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:])); got != w {
					t.Fatalf("%s[%d] = %v, want %v", ti.Name, i, got, w)
				}
			}
		case len(mt.Shape) == 2 && ti.Type == parser.GGMLTypeQ8_0:
			for i, w := range want { // block i/32: an f16 scale, then 32 int8
				blk := data[34*(i/32):]
				d := float16.Frombits(binary.LittleEndian.Uint16(blk)).Float32()
				got := d * float32(int8(blk[2+i%32]))
				if math.Abs(float64(got-w)) > float64(d) { // half a step, and the f16 scale's rounding
					t.Fatalf("%s[%d] = %v after q8_0, want %v (step %v)", ti.Name, i, got, w, d)
				}
			}
		default:
			t.Errorf("%s (shape %v) is stored as %v", ti.Name, mt.Shape, ti.Type)
		}
	}
	tmpl, err := testassets.Find("llama3-instruct", "tool_calls")
	if err != nil {
		t.Fatal(err)
	}
	kv := gf.Header.MetadataKV
	// The template's last line break is not kept (Jinja drops it when rendering too).
	for key, want := range map[string]any{"tokenizer.chat_template": strings.TrimSuffix(tmpl.Source, "\n"), "tokenizer.ggml.pre": "llama-bpe",
		"llama.rope.freq_base": float32(500000), "llama.embedding_length": uint32(32), "llama.context_length": uint32(4096)} {
		v, ok := kv.Get(key)
		var got any
		switch want.(type) {
		case string:
			got = v.ValueString()
		case float32:
			got = v.ValueFloat32()
		case uint32:
			got = v.ValueUint32()
		}
		if !ok || got != want {
			t.Errorf("%s = %v, want %v", key, clip(got), clip(want))
		}
	}
}

func clip(v any) any {
	if s, ok := v.(string); ok && len(s) > 60 {
		return s[:60] + "…"
	}
	return v
}

// TestConvertRefuses: weights that do not fit the model are refused with what is wrong.
func TestConvertRefuses(t *testing.T) {
	cases := []struct {
		name, want string
		edit       func(m map[string]any)
	}{
		{"transposed", "tensor blk.0.attn_k.weight has shape [32 16]", func(m map[string]any) {
			tensor(m, "blk.0.attn_k.weight")["shape"] = []int{32, 16}
		}},
		{"missing", "no tensor blk.0.ffn_up.weight", func(m map[string]any) {
			ts := m["tensors"].([]any)
			for i, x := range ts {
				if x.(map[string]any)["name"] == "blk.0.ffn_up.weight" {
					m["tensors"] = append(ts[:i:i], ts[i+1:]...)
				}
			}
		}},
		{"unknown", "tensor blk.7.attn_q.weight is not a tensor", func(m map[string]any) {
			tensor(m, "blk.0.attn_q.weight")["name"] = "blk.7.attn_q.weight"
		}},
		{"outside", `"../weights-000.bin" is not a file of the weights' directory`, func(m map[string]any) {
			part(m, "output_norm.weight")["file"] = "../weights-000.bin"
		}},
		{"past the end", "run past the end of weights-000.bin", func(m map[string]any) {
			part(m, "output_norm.weight")["offset"] = 15 << 20
		}},
		{"short", "its parts hold", func(m map[string]any) {
			part(m, "output_norm.weight")["bytes"] = 2
		}},
		{"dtype", `is "bf16", want f16`, func(m map[string]any) { tensor(m, "output_norm.weight")["dtype"] = "bf16" }},
		{"vocabulary", "vocabulary of 32000 tokens", func(m map[string]any) { hp(m)["vocab"] = 32000 }},
		{"eps", "norm epsilon 1e-06", func(m map[string]any) { hp(m)["normEps"] = 1e-6 }},
		{"format", "manifest format", func(m map[string]any) { m["format"] = "other/2" }},
	}
	base := t.TempDir()
	if err := WriteRandom(base, small, 1); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(filepath.Join(base, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal(orig, &m); err != nil {
				t.Fatal(err)
			}
			tc.edit(m)
			b, _ := json.Marshal(m)
			if err := os.WriteFile(filepath.Join(base, "manifest.json"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			err := Convert(base, filepath.Join(t.TempDir(), "model.gguf"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func tensor(m map[string]any, name string) map[string]any {
	for _, x := range m["tensors"].([]any) {
		if t := x.(map[string]any); t["name"] == name {
			return t
		}
	}
	panic(name)
}

func part(m map[string]any, name string) map[string]any {
	return tensor(m, name)["parts"].([]any)[0].(map[string]any)
}

func hp(m map[string]any) map[string]any { return m["hyperparameters"].(map[string]any) }

// TestDefaultsMatchWeightsPy: the Go defaults are weights.py's.
func TestDefaultsMatchWeightsPy(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "weights.py"))
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^DEFAULTS = (\{.*\})$`).FindSubmatch(b)
	if line == nil {
		t.Fatal("weights.py has no DEFAULTS line")
	}
	var d struct {
		Embd      int     `json:"embd"`
		Layers    int     `json:"layers"`
		Heads     int     `json:"heads"`
		KVHeads   int     `json:"kv_heads"`
		FF        int     `json:"ff"`
		Ctx       int     `json:"ctx"`
		RopeTheta float32 `json:"rope_theta"`
	}
	if err := json.Unmarshal(line[1], &d); err != nil {
		t.Fatalf("DEFAULTS of weights.py: %v", err)
	}
	got := Hyperparameters{Vocab: 128256, Embd: d.Embd, Layers: d.Layers, Heads: d.Heads, KVHeads: d.KVHeads, FF: d.FF,
		Ctx: d.Ctx, RopeTheta: d.RopeTheta, NormEps: NormEps}
	if got != Defaults {
		t.Errorf("weights.py's defaults %+v, Go's %+v", got, Defaults)
	}
}

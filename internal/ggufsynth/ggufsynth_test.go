package ggufsynth

import (
	"bytes"
	"encoding/binary"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	parser "github.com/gpustack/gguf-parser-go"
)

func TestWriteParsesBack(t *testing.T) {
	for _, name := range []string{"tiny", "small"} {
		t.Run(name, func(t *testing.T) {
			spec, err := Preset(name)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), name+".gguf")
			if err := Write(path, spec); err != nil {
				t.Fatal(err)
			}
			gf, err := parser.ParseGGUFFile(path)
			if err != nil {
				t.Fatalf("parsing written model: %v", err)
			}

			type dims struct {
				Arch                                  string
				Ctx, Embd, Layers, Heads, KVHeads, FF uint64
				Tensors                               int
				Tokenizer                             string
				Vocab, BOS, EOS                       int64
			}
			a, tok := gf.Architecture(), gf.Tokenizer()
			ff := uint64(0)
			if len(a.FeedForwardLength) > 0 {
				ff = a.FeedForwardLength[0]
			}
			got := dims{
				Arch: a.Architecture, Ctx: a.MaximumContextLength, Embd: a.EmbeddingLength,
				Layers: a.BlockCount, Heads: a.AttentionHeadCount, KVHeads: a.AttentionHeadCountKV, FF: ff,
				Tensors:   len(gf.TensorInfos),
				Tokenizer: tok.Model, Vocab: int64(tok.TokensLength), BOS: tok.BOSTokenID, EOS: tok.EOSTokenID,
			}
			want := dims{
				Arch: "llama", Ctx: uint64(spec.Ctx), Embd: uint64(spec.Embd),
				Layers: uint64(spec.Layers), Heads: uint64(spec.Heads), KVHeads: uint64(spec.KVHeads), FF: uint64(spec.FF),
				Tensors:   2 + 9*spec.Layers,
				Tokenizer: "llama", Vocab: int64(spec.Vocab), BOS: BOSToken, EOS: EOSToken,
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("parsed metadata (-want +got):\n%s", d)
			}

			var elems int64
			for _, ti := range gf.TensorInfos {
				n := int64(1)
				for _, d := range ti.Dimensions {
					n *= int64(d)
				}
				elems += n
			}
			if elems != spec.Params() {
				t.Errorf("tensor elements = %d, Spec.Params() = %d", elems, spec.Params())
			}
			if tmpl, ok := gf.Header.MetadataKV.Get("tokenizer.chat_template"); !ok || tmpl.ValueString() != ChatMLTemplate {
				t.Errorf("chat template missing or wrong: %v", tmpl)
			}
		})
	}
}

func TestWriteIsDeterministic(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, spec Spec) []byte { return writeModel(t, filepath.Join(dir, name), spec) }
	a := write("a.gguf", Tiny())
	b := write("b.gguf", Tiny())
	if !bytes.Equal(a, b) {
		t.Error("the same spec produced different bytes")
	}
	other := Tiny()
	other.Seed = 2
	if bytes.Equal(a, write("c.gguf", other)) {
		t.Error("a different seed produced identical bytes")
	}
	// Tiny must stay tiny: ≈2 MB.
	if n := len(a); n < 1<<20 || n > 3<<20 {
		t.Errorf("tiny model is %d bytes, want about 2 MB", n)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func TestPresetSizes(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		preset         string
		elemBytes      float64 // of the matrices; a block's scale counted in
		minMiB, maxMiB float64
	}{
		{"tiny", 4, 1, 3},
		{"small", 2, 15, 25},
		{"mid", 2, 165, 185},
		{"8b-q4_0", 18.0 / 32, 3800, 4000},
		{"8b-f16", 2, 13500, 14000},
		// 30.5 B parameters, every expert's; 20.9 B.
		{"qwen3moe-30b-a3b-q4_0", 18.0 / 32, 16000, 16500},
		{"gpt-oss-20b-q4_0", 18.0 / 32, 11000, 11500},
	}
	for _, tt := range tests {
		spec, err := Preset(tt.preset)
		if err != nil {
			t.Fatal(err)
		}
		if err := spec.Validate(); err != nil {
			t.Errorf("%s: %v", tt.preset, err)
		}
		size := float64(spec.Params()) * tt.elemBytes / mib
		if size < tt.minMiB || size > tt.maxMiB {
			t.Errorf("%s: weights are %.0f MiB, want %.0f..%.0f", tt.preset, size, tt.minMiB, tt.maxMiB)
		}
	}
	if !slices.Equal(PresetNames, []string{"tiny", "small", "mid", "8b-q4_0", "8b-f16", "qwen3moe-30b-a3b-q4_0", "gpt-oss-20b-q4_0"}) {
		t.Errorf("PresetNames = %v", PresetNames)
	}
	if _, err := Preset("huge"); err == nil || !strings.Contains(err.Error(), "8b-q4_0, 8b-f16") {
		t.Errorf("unknown preset: error %v, want one naming every preset", err)
	}
}

// TestWriteIsIndependentOfConcurrency: tensors are written concurrently, one goroutine
// each up to GOMAXPROCS, and generated a chunk at a time from their index; the file is
// the same as when they are written one after the other, and every value is the one the
// generator gives when stepped from the start of its tensor, one value at a time.
func TestWriteIsIndependentOfConcurrency(t *testing.T) {
	for _, dt := range []DType{F32, F16, Q8_0, Q4_0} {
		spec := Small()
		spec.DType, spec.Untied, spec.Reply = dt, true, &Reply{Token: 300, End: EOSToken}
		write := func(procs int) []byte {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			return writeModel(t, filepath.Join(t.TempDir(), "m.gguf"), spec)
		}
		if !bytes.Equal(write(1), write(8)) {
			t.Errorf("%s: written by 1 and by 8 goroutines, the bytes differ", dt)
		}
	}

	// The reference: splitmix64 stepped once per value from the tensor's seed.
	w := &weights{n: 3*chunkValues + 96, scale: 0.25, state: 12345,
		steer: func(i uint64) (float32, bool) { return 7, i%1000 == 3 }}
	want := make([]float32, w.n)
	state := w.state
	for i := range want {
		state += 0x9E3779B97F4A7C15
		z := state
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		z ^= z >> 31
		want[i] = (2*(float32(z>>40)/float32(1<<24)) - 1) * w.scale
		if i%1000 == 3 {
			want[i] = 7
		}
	}
	for _, from := range []uint64{0, 1, 31, chunkValues - 5, 2*chunkValues + 7} {
		got := make([]float32, min(100, w.n-from))
		w.values(got, from)
		if !slices.Equal(got, want[from:from+uint64(len(got))]) {
			t.Errorf("values from %d differ from the generator stepped from the start", from)
		}
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	for i, v := range want {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(b.Bytes()[4*i:])); got != v {
			t.Fatalf("value %d written as %v, want %v", i, got, v)
		}
	}
}

func TestKVBytesPerToken(t *testing.T) {
	// mid: 8 layers × (K+V) × 4 kv heads × 64 dims × 2 bytes = 8192 bytes per token.
	if got := Mid().KVBytesPerToken(2); got != 8192 {
		t.Errorf("mid KV bytes per token = %v, want 8192", got)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Spec)
		want   string
	}{
		{"small vocab", func(s *Spec) { s.Vocab = 100 }, "vocab"},
		{"heads do not divide embd", func(s *Spec) { s.Heads = 3 }, "multiple of heads"},
		{"kv heads do not divide heads", func(s *Spec) { s.KVHeads = 3 }, "multiple of kv heads"},
		{"zero layers", func(s *Spec) { s.Layers = 0 }, "positive"},
		{"bad dtype", func(s *Spec) { s.DType = "q4" }, "dtype"},
		{"quantized rows not whole blocks", func(s *Spec) { s.DType, s.FF = Q4_0, 500 }, "multiples of 32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Tiny()
			tt.mutate(&s)
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error mentioning %q", err, tt.want)
			}
			if err := Write(filepath.Join(t.TempDir(), "x.gguf"), s); err == nil {
				t.Error("Write accepted an invalid spec")
			}
		})
	}
}

func TestVocabulary(t *testing.T) {
	for _, n := range []int{Tiny().Vocab, Mid().Vocab} {
		tokens, scores, types := Vocabulary(n)
		if len(tokens) != n || len(scores) != n || len(types) != n {
			t.Fatalf("vocab %d: got %d tokens, %d scores, %d types", n, len(tokens), len(scores), len(types))
		}
		seen := make(map[string]bool, n)
		for _, tok := range tokens {
			if seen[tok] {
				t.Fatalf("vocab %d: duplicate token %q", n, tok)
			}
			seen[tok] = true
		}
		if tokens[FirstByteToken] != "<0x00>" || tokens[FirstByteToken+255] != "<0xFF>" || types[FirstByteToken+10] != tokenTypeByte {
			t.Errorf("vocab %d: byte tokens misplaced", n)
		}
		if tokens[IMEndToken] != "<|im_end|>" || types[IMEndToken] != tokenTypeControl {
			t.Errorf("vocab %d: <|im_end|> misplaced", n)
		}
	}
}

// TestReplySteersTheProjections: a Reply model's embedding and output projection hold
// the steering values in their first two columns and the seed's values elsewhere.
func TestReplySteersTheProjections(t *testing.T) {
	spec := Tiny()
	spec.DType, spec.Untied = F32, true
	plain := tensorValues(t, spec)
	spec.Reply = &Reply{Token: 300, End: EOSToken}
	steered := tensorValues(t, spec)
	e := spec.Embd
	for _, name := range []string{"token_embd.weight", "output.weight"} {
		p, s := plain[name], steered[name]
		for tok := range spec.Vocab {
			for c := range e {
				i := tok*e + c
				want := p[i]
				switch {
				case name == "token_embd.weight" && c == 0:
					want = map[bool]float32{true: 0, false: replyWeight}[tok == 300]
				case name == "token_embd.weight" && c == 1:
					want = map[bool]float32{true: replyWeight, false: 0}[tok == 300]
				case name == "output.weight" && c == 0:
					want = map[bool]float32{true: replyLogit, false: 0}[tok == 300]
				case name == "output.weight" && c == 1:
					want = map[bool]float32{true: replyLogit, false: 0}[tok == EOSToken]
				}
				if s[i] != want {
					t.Fatalf("%s[token %d, column %d] = %v, want %v", name, tok, c, s[i], want)
				}
			}
		}
	}
	if !slices.Equal(plain["blk.0.attn_q.weight"], steered["blk.0.attn_q.weight"]) {
		t.Error("the reply changed a layer's weights")
	}
	for _, r := range []*Reply{{Token: 1, End: 1}, {Token: -1, End: 2}, {Token: 1, End: spec.Vocab}} {
		spec.Reply = r
		if spec.Validate() == nil {
			t.Errorf("Validate accepted reply %+v", *r)
		}
	}
	spec.Reply, spec.Untied = &Reply{Token: 300, End: EOSToken}, false
	if spec.Validate() == nil {
		t.Error("Validate accepted a reply with a tied output projection")
	}
}

func tensorValues(t *testing.T, spec Spec) map[string][]float32 {
	t.Helper()
	out := map[string][]float32{}
	for _, ts := range tensors(spec) {
		var b bytes.Buffer
		if _, err := ts.WriterTo.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		raw := b.Bytes()
		vals := make([]float32, len(raw)/4)
		for i := range vals {
			vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		out[ts.Name] = vals
	}
	return out
}

// writeModel writes spec to path and returns the file's bytes.
func writeModel(t *testing.T, path string, spec Spec) []byte {
	t.Helper()
	if err := Write(path, spec); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTrainedWeights: a spec with trained values writes them instead of random ones,
// and Validate names a missing, mis-sized or foreign tensor.
func TestTrainedWeights(t *testing.T) {
	spec := Tiny()
	trained := map[string][]float32{}
	for name, shape := range spec.TensorShapes() {
		n := uint64(1)
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%7) - 3
		}
		trained[name] = v
	}
	spec.Trained = trained
	got := tensorValues(t, spec)
	for name, want := range trained {
		if !slices.Equal(got[name], want) {
			t.Errorf("%s was not written from the trained values", name)
		}
	}
	for _, tc := range []struct {
		name, want string
		edit       func(m map[string][]float32)
	}{
		{"missing", "no tensor blk.1.ffn_up.weight", func(m map[string][]float32) { delete(m, "blk.1.ffn_up.weight") }},
		{"size", "trained tensor output_norm.weight has 3 values", func(m map[string][]float32) { m["output_norm.weight"] = make([]float32, 3) }},
		{"foreign", "output.weight is not a tensor of this model", func(m map[string][]float32) { m["output.weight"] = nil }},
	} {
		m := maps.Clone(trained)
		tc.edit(m)
		spec.Trained = m
		if err := spec.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

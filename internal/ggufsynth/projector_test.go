package ggufsynth

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestProjectorValidate(t *testing.T) {
	tiny, err := TinyFamily(Gemma3)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := TinyProjector(tiny)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		change func(p *Projector)
		err    string
	}{
		{"tiny", func(*Projector) {}, ""},
		{"heads do not divide", func(p *Projector) { p.Heads = 3 }, "multiple of its 3 heads"},
		{"ff equal to embd", func(p *Projector) { p.FF = p.Embd }, "must differ"},
		{"patch does not divide", func(p *Projector) { p.PatchSize = 7 }, "multiple of patch size"},
		{"merge does not divide", func(p *Projector) { p.Merge = 3 }, "multiple of patch size"},
		{"no text embd", func(p *Projector) { p.TextEmbd = 0 }, "positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := ok
			tc.change(&p)
			err := p.Validate()
			if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Validate: %v, want %q", err, tc.err)
			}
		})
	}
	if _, err := TinyProjector(Tiny()); err == nil {
		t.Fatal("a projector for a llama model: want an error naming the gemma3 family")
	}
}

// The written projector has the keys and tensors mtmd's clip loader asks for, the
// projection as wide as the text model's embedding.
func TestWriteProjectorKeysAndTensors(t *testing.T) {
	tiny, _ := TinyFamily(Gemma3)
	p, _ := TinyProjector(tiny)
	if p.ImageTokens() != 16 {
		t.Fatalf("image tokens %d, want (64/8/2)² = 16", p.ImageTokens())
	}
	path := filepath.Join(t.TempDir(), "mmproj.gguf")
	if err := WriteProjector(path, p); err != nil {
		t.Fatal(err)
	}
	g := decodeFile(t, path)
	kv := g.KV()
	if kv.String("general.architecture") != "clip" || kv["clip.projector_type"] != ProjectorType {
		t.Fatalf("architecture %q, projector type %q", kv.String("general.architecture"), kv["clip.projector_type"])
	}
	shapes := map[string][]uint64{}
	for _, tn := range g.Tensors().Items() {
		shapes[tn.Name] = tn.Shape
	}
	want := map[string][]uint64{
		"v.patch_embd.weight":        {8, 8, 3, 64},
		"v.position_embd.weight":     {64, 64},
		"v.blk.1.ffn_down.weight":    {96, 64},
		"mm.soft_emb_norm.weight":    {64},
		"mm.input_projection.weight": {uint64(tiny.Embd), 64},
	}
	for name, shape := range want {
		got, ok := shapes[name]
		if !ok || len(got) != len(shape) {
			t.Fatalf("tensor %s: %v, want %v", name, got, shape)
		}
		for i := range shape {
			if got[i] != shape[i] {
				t.Fatalf("tensor %s: %v, want %v", name, got, shape)
			}
		}
	}
}

package ggufsynth

import (
	"errors"
	"fmt"
	"os"

	"github.com/ollama/ollama/fs/ggml"
)

// Projector is a vision projector (the mmproj GGUF beside a model) of Gemma 3's kind,
// as llama.cpp's mtmd loads it: a SigLIP-style vision transformer over square
// patches, an average pool of Merge×Merge patches, an RMS norm and a projection into
// the text model's embedding. Its weights are pseudo-random like a model's: an image
// still reaches the text model as embeddings that depend on every pixel.
type Projector struct {
	Name string
	// TextEmbd is the text model's embedding size, which the projection outputs.
	TextEmbd int
	// Embd, Heads, FF and Layers shape the vision transformer (Embd a multiple of
	// Heads, FF not equal to Embd).
	Embd, Heads, FF, Layers int
	// ImageSize is the side the picture is resized to, PatchSize a patch's side and
	// Merge the side of the pooled block of patches; each divides the one before.
	ImageSize, PatchSize, Merge int
	Seed                        uint64
}

// ProjectorType is the clip.projector_type the synthesized projectors declare.
const ProjectorType = "gemma3"

// TinyProjector is a projector for text, a tiny Gemma3 model (TinyFamily(Gemma3)):
// a 64-pixel picture in 8-pixel patches, pooled 2×2 into 16 image tokens.
func TinyProjector(text Spec) (Projector, error) {
	if text.Family != Gemma3 {
		return Projector{}, fmt.Errorf("synthesized projectors pair with the %s family, not %q", Gemma3, text.Family.Arch())
	}
	return Projector{Name: text.Name + "-mmproj", TextEmbd: text.Embd, Embd: 64, Heads: 4, FF: 96, Layers: 2,
		ImageSize: 64, PatchSize: 8, Merge: 2, Seed: text.Seed}, nil
}

// ImageTokens is how many positions one image takes in the text model's context.
func (p Projector) ImageTokens() int {
	side := p.ImageSize / p.PatchSize / p.Merge
	return side * side
}

// Validate checks that mtmd can build the projector's graph.
func (p Projector) Validate() error {
	switch {
	case p.TextEmbd <= 0 || p.Embd <= 0 || p.Heads <= 0 || p.FF <= 0 || p.Layers <= 0:
		return errors.New("a projector needs positive TextEmbd, Embd, Heads, FF and Layers")
	case p.Embd%p.Heads != 0:
		return fmt.Errorf("the vision embedding %d is not a multiple of its %d heads", p.Embd, p.Heads)
	case p.FF == p.Embd:
		return errors.New("the vision feed-forward width must differ from the embedding (mtmd reads equal ones as swapped)")
	case p.PatchSize <= 0 || p.Merge <= 0 || p.ImageSize%p.PatchSize != 0 || (p.ImageSize/p.PatchSize)%p.Merge != 0:
		return fmt.Errorf("image size %d must be a multiple of patch size %d times merge %d", p.ImageSize, p.PatchSize, p.Merge)
	}
	return nil
}

// WriteProjector writes the projector p to path (created or truncated).
func WriteProjector(path string, p Projector) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("invalid projector: %w", err)
	}
	return writeAtomic(path, func(f *os.File) error {
		return writeGGUF(f, sortedKV(p.metadata()), p.tensors(), false)
	})
}

func (p Projector) metadata() ggml.KV {
	u := func(n int) uint32 { return uint32(n) }
	return ggml.KV{
		"general.architecture":                     "clip",
		"general.name":                             p.Name,
		"general.file_type":                        uint32(0), // all F32
		"clip.has_vision_encoder":                  true,
		"clip.projector_type":                      ProjectorType,
		"clip.use_gelu":                            true,
		"clip.vision.embedding_length":             u(p.Embd),
		"clip.vision.feed_forward_length":          u(p.FF),
		"clip.vision.block_count":                  u(p.Layers),
		"clip.vision.attention.head_count":         u(p.Heads),
		"clip.vision.attention.layer_norm_epsilon": float32(1e-6),
		"clip.vision.projection_dim":               u(p.TextEmbd),
		"clip.vision.image_size":                   u(p.ImageSize),
		"clip.vision.patch_size":                   u(p.PatchSize),
		"clip.vision.projector.scale_factor":       u(p.Merge),
		"clip.vision.image_mean":                   []float32{0.5, 0.5, 0.5},
		"clip.vision.image_std":                    []float32{0.5, 0.5, 0.5},
	}
}

// tensors are the projector's tensors with the names and (ggml-order) shapes clip's
// loader asks for.
func (p Projector) tensors() []*ggml.Tensor {
	l := &tensorList{s: Spec{DType: F32, Seed: p.Seed}}
	e, ff, ps := uint64(p.Embd), uint64(p.FF), uint64(p.PatchSize)
	side := uint64(p.ImageSize / p.PatchSize)
	l.matrix("v.patch_embd.weight", ps, ps, 3, e)
	l.vector("v.patch_embd.bias", 0.1, 0, e)
	l.vector("v.position_embd.weight", 0.5, 0, e, side*side)
	for i := range p.Layers {
		b := fmt.Sprintf("v.blk.%d.", i)
		for _, n := range []string{"attn_q", "attn_k", "attn_v", "attn_out"} {
			l.matrix(b+n+".weight", e, e)
			l.vector(b+n+".bias", 0.1, 0, e)
		}
		l.norm(b+"ln1.weight", e)
		l.vector(b+"ln1.bias", 0.1, 0, e)
		l.norm(b+"ln2.weight", e)
		l.vector(b+"ln2.bias", 0.1, 0, e)
		l.matrix(b+"ffn_up.weight", e, ff)
		l.vector(b+"ffn_up.bias", 0.1, 0, ff)
		l.matrix(b+"ffn_down.weight", ff, e)
		l.vector(b+"ffn_down.bias", 0.1, 0, e)
	}
	l.norm("v.post_ln.weight", e)
	l.vector("v.post_ln.bias", 0.1, 0, e)
	l.norm("mm.soft_emb_norm.weight", e)
	l.matrix("mm.input_projection.weight", uint64(p.TextEmbd), e)
	return l.ts
}

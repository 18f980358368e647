package ggufsynth

import "fmt"

// tinyWindow is the sliding window of the tiny presets: short, so that a test's
// prompt of a few hundred bytes runs past it and the local layers' cache wraps.
const tinyWindow = 32

// TinyFamily is a model of family f of about Tiny's size (a few MiB, F32, the
// synthetic vocabulary and chat template) for functional tests: each family's
// layers, experts, window and recurrent state at their smallest useful size.
func TinyFamily(f Family) (Spec, error) {
	s := Tiny()
	s.Name, s.Family, s.KeyLength = "macfleet-tiny-"+f.Arch(), f, s.Embd/s.Heads
	switch f {
	case Llama, "":
		return Tiny(), nil
	case Qwen3MoE:
		s.FF, s.Experts = 256, &Experts{Count: 8, Used: 2, FF: 64}
	case GPTOSS:
		// Queries wider than the embedding, as gpt-oss's are.
		s.KeyLength, s.FF, s.Untied = 64, 64, true
		s.Experts, s.Window = &Experts{Count: 8, Used: 2, FF: 64}, &Window{Size: tinyWindow}
	case GLM4MoE:
		s.Layers, s.FF, s.Untied = 3, 256, true
		s.Experts = &Experts{Count: 8, Used: 2, FF: 64, SharedFF: 64, DenseLead: 1}
	case Gemma3:
		// Untied: Gemma scales the embeddings by sqrt(Embd), so with random weights a
		// tied projection answers every token with itself.
		s.Layers, s.FF, s.Window, s.Untied = 6, 256, &Window{Size: tinyWindow}, true
	case Qwen3Next:
		s.Layers, s.FF = 4, 256
		s.Experts = &Experts{Count: 8, Used: 2, FF: 64, SharedFF: 128}
		s.DeltaNet = &DeltaNet{ConvKernel: 4, StateSize: 32, KHeads: 2, VHeads: 4}
	default:
		return Spec{}, fmt.Errorf("unknown family %q (want one of %v)", f, Families)
	}
	return s, nil
}

// Qwen3MoE30BA3B is the shape of Qwen3-Coder-30B-A3B (48 layers, 128 experts of
// which 8 per token, 32 query / 4 KV heads of 128, vocab 151936), matrices stored as
// dt; its output projection untied.
func Qwen3MoE30BA3B(dt DType) Spec {
	return Spec{Name: "macfleet-qwen3moe-30b-a3b-" + string(dt), Family: Qwen3MoE, Vocab: 151936, Embd: 2048,
		Layers: 48, Heads: 32, KVHeads: 4, KeyLength: 128, FF: 6144, Ctx: 32768, DType: dt, Untied: true,
		RopeBase: 1e6, Seed: 1, Experts: &Experts{Count: 128, Used: 8, FF: 768}}
}

// GPTOSS20B is the shape of gpt-oss-20b (24 layers alternating a 128-token window
// and full attention, 32 experts of which 4 per token, 64 query / 8 KV heads of 64,
// vocab 201088), matrices stored as dt.
func GPTOSS20B(dt DType) Spec {
	return Spec{Name: "macfleet-gpt-oss-20b-" + string(dt), Family: GPTOSS, Vocab: 201088, Embd: 2880,
		Layers: 24, Heads: 64, KVHeads: 8, KeyLength: 64, FF: 2880, Ctx: 131072, DType: dt, Untied: true,
		RopeBase: 150000, Seed: 1, Experts: &Experts{Count: 32, Used: 4, FF: 2880}, Window: &Window{Size: 128}}
}

// GLM45Air is the shape of GLM-4.5-Air without its next-token-prediction layer (46
// layers, the first dense; 128 experts of which 8 per token and one shared; 96 query
// / 8 KV heads of 128, vocab 151552), matrices stored as dt.
func GLM45Air(dt DType) Spec {
	return Spec{Name: "macfleet-glm-4.5-air-" + string(dt), Family: GLM4MoE, Vocab: 151552, Embd: 4096,
		Layers: 46, Heads: 96, KVHeads: 8, KeyLength: 128, FF: 10944, Ctx: 131072, DType: dt, Untied: true,
		RopeBase: 1e6, Seed: 1, Experts: &Experts{Count: 128, Used: 8, FF: 1408, SharedFF: 1408, DenseLead: 1}}
}

// Package splitsupport says, from a GGUF header's general.architecture, whether one
// replica of a model may be split across Macs by layers (docs/split-model.md).
//
// A split worker computes the attention blocks of its layer range and sends the
// activations on; the recurrent state of a recurrent model (Mamba, RWKV) or of a
// hybrid's recurrent layers (Qwen3-Next's gated delta-net layers) is a second state
// beside the attention cache, which split workers do not keep. The runner refuses such
// a split when it loads (metal/runner/server, from llama.cpp's own flags); the control
// plane asks Refusal first, so that it never plans a split that would fail there. The
// architectures are llama.cpp's (llm_arch_is_recurrent and llm_arch_is_hybrid of the
// vendored copy: TestArchitecturesAreLlamaCpps keeps them in step).
package splitsupport

import "fmt"

// Kind is how a model keeps its state across tokens.
type Kind int

const (
	// Attention: every layer keeps only a KV cache, which split workers keep for
	// their layers. Such a model may be split.
	Attention Kind = iota
	// Recurrent: its layers keep a recurrent state instead of a KV cache.
	Recurrent
	// Hybrid: some of its layers keep a recurrent state beside the others' KV cache.
	Hybrid
)

// recurrent and hybrid are llama.cpp's recurrent and hybrid architectures, by their
// general.architecture names.
var (
	recurrent = map[string]bool{"mamba": true, "mamba2": true, "rwkv6": true, "rwkv6qwen2": true, "rwkv7": true, "arwkv7": true}
	hybrid    = map[string]bool{"jamba": true, "falcon-h1": true, "plamo2": true, "granitehybrid": true, "lfm2": true,
		"lfm2moe": true, "nemotron_h": true, "nemotron_h_moe": true, "qwen3next": true}
)

// KindOf is the kind of the architecture arch (general.architecture); an unknown
// one is Attention, as llama.cpp takes it.
func KindOf(arch string) Kind {
	switch {
	case hybrid[arch]:
		return Hybrid
	case recurrent[arch]:
		return Recurrent
	}
	return Attention
}

// Refusal says why a model of architecture arch may not be split across Macs, in the
// runner's words; "" when it may.
func Refusal(arch string) string {
	switch KindOf(arch) {
	case Hybrid:
		return fmt.Sprintf("its recurrent layers keep a state beside the attention cache (%s), which split workers do not compute", arch)
	case Recurrent:
		return fmt.Sprintf("its layers keep a recurrent state (%s), which split workers do not compute", arch)
	}
	return ""
}

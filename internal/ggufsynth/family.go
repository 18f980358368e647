package ggufsynth

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ollama/ollama/fs/ggml"
)

// Family is a model architecture as GGUF files name it (general.architecture).
type Family string

const (
	// Llama is the dense Llama shape (also the family of a Spec with none).
	Llama Family = "llama"
	// Qwen3MoE is Qwen3's mixture of experts (Qwen3-Coder-30B-A3B): every
	// feed-forward layer is routed to a few of many experts; attention has per-head
	// query and key norms.
	Qwen3MoE Family = "qwen3moe"
	// GPTOSS is gpt-oss (llama.cpp's openai-moe-iswa graph): experts with biases,
	// sliding-window attention on every other layer, and attention sinks.
	GPTOSS Family = "gpt-oss"
	// Gemma3 is Gemma 3: dense, five sliding-window layers to one global.
	Gemma3 Family = "gemma3"
	// GLM4MoE is GLM-4.5 (GLM-4.5-Air): leading dense layers, then routed experts
	// with a shared one, sigmoid gating with a per-expert bias, and biased attention.
	GLM4MoE Family = "glm4moe"
	// Qwen3Next is Qwen3-Next, a hybrid: three gated delta-net layers (a recurrent
	// state, no KV cache) to one attention layer, all with routed and shared experts.
	Qwen3Next Family = "qwen3next"
)

// Families are the families Write synthesizes, Llama first.
var Families = []Family{Llama, Qwen3MoE, GPTOSS, GLM4MoE, Gemma3, Qwen3Next}

// Arch is the general.architecture value and the prefix of the family's keys.
func (f Family) Arch() string {
	if f == "" {
		return string(Llama)
	}
	return string(f)
}

// Experts are a mixture-of-experts feed-forward layer.
type Experts struct {
	// Count experts, Used of them per token, each a SwiGLU of width FF.
	Count, Used, FF int
	// SharedFF is the width of the shared expert every token also goes through
	// (Qwen3Next; GLM4MoE, a multiple of FF; zero: none).
	SharedFF int
	// DenseLead is the number of leading layers with a dense feed-forward instead
	// (GLM4MoE).
	DenseLead int
}

// Window is sliding-window attention: Size tokens, on the layers the family's
// pattern makes local (llama.cpp fixes the pattern per family: five local to one
// global for Gemma3, every other layer for GPTOSS).
type Window struct {
	Size int
}

// DeltaNet are the gated delta-net layers of a hybrid: every layer but each
// AttentionInterval-th (4 in llama.cpp's Qwen3Next) keeps a recurrent state of
// VHeads matrices StateSize×StateSize and a convolution state of ConvKernel-1 steps.
type DeltaNet struct {
	ConvKernel, StateSize int
	// KHeads (ssm.group_count) key heads and VHeads (ssm.time_step_rank) value heads;
	// VHeads is a multiple of KHeads.
	KHeads, VHeads int
}

// glmSigmoidGating is llama.cpp's expert_gating_func for sigmoid (GLM-4.5's).
const glmSigmoidGating = 2

// qwen3NextAttentionInterval is llama.cpp's fixed interval of Qwen3Next's attention
// layers: layer i is recurrent unless (i+1) is a multiple of it.
const qwen3NextAttentionInterval = 4

// Recurrent reports whether layer il of s is a recurrent (delta-net) layer.
func (s Spec) Recurrent(il int) bool {
	return s.Family == Qwen3Next && (il+1)%qwen3NextAttentionInterval != 0
}

// keyDim and valueDim are a delta-net layer's key and value widths.
func (d DeltaNet) keyDim() int   { return d.StateSize * d.KHeads }
func (d DeltaNet) valueDim() int { return d.StateSize * d.VHeads }

// validateFamily checks the parts a family needs.
func (s Spec) validateFamily() error {
	f := Family(s.Family.Arch())
	if !slices.Contains(Families, f) {
		return fmt.Errorf("family %q is not one of %v", s.Family, Families)
	}
	needs := map[Family][3]bool{ // experts, window, delta-net
		Llama: {}, Qwen3MoE: {true, false, false}, GPTOSS: {true, true, false}, GLM4MoE: {true, false, false},
		Gemma3: {false, true, false}, Qwen3Next: {true, false, true},
	}[f]
	has := [3]bool{s.Experts != nil, s.Window != nil, s.DeltaNet != nil}
	if has != needs {
		return fmt.Errorf("family %s needs experts %t, a window %t, delta-net layers %t; the spec has %t, %t, %t",
			f, needs[0], needs[1], needs[2], has[0], has[1], has[2])
	}
	switch {
	case f != Llama && (s.Reply != nil || s.Trained != nil):
		return fmt.Errorf("family %s cannot be steered to a reply nor given trained weights", f)
	case f == GPTOSS && !s.Untied:
		return fmt.Errorf("family %s needs an untied output projection", f)
	}
	if e := s.Experts; e != nil {
		if err := e.validate(f, s.Layers); err != nil {
			return err
		}
	}
	if w := s.Window; w != nil && (w.Size <= 0 || w.Size >= s.Ctx) {
		return fmt.Errorf("window %d must be positive and below the context %d", w.Size, s.Ctx)
	}
	if d := s.DeltaNet; d != nil {
		switch {
		case d.ConvKernel < 2 || d.StateSize <= 0 || d.KHeads <= 0 || d.VHeads <= 0:
			return errors.New("delta-net conv kernel (at least 2), state size and heads must be positive")
		case d.VHeads%d.KHeads != 0:
			return fmt.Errorf("delta-net value heads %d are not a multiple of key heads %d", d.VHeads, d.KHeads)
		case s.Layers < qwen3NextAttentionInterval:
			return fmt.Errorf("%s needs at least %d layers for one attention layer", f, qwen3NextAttentionInterval)
		}
	}
	return s.validateRows()
}

// validateRows checks that every quantized tensor of a family's model has rows of
// whole blocks.
func (s Spec) validateRows() error {
	if !s.DType.quantized() || s.Family.Arch() == string(Llama) {
		return nil
	}
	for _, t := range familyTensors(s) {
		if t.Kind != uint32(ggml.TensorTypeF32) && t.Shape[0]%blockSize != 0 {
			return fmt.Errorf("tensor %s has rows of %d values, not a multiple of %d for %s", t.Name, t.Shape[0], blockSize, s.DType)
		}
	}
	return nil
}

func (e Experts) validate(f Family, layers int) error {
	switch {
	case e.Count <= 0 || e.Used <= 0 || e.Used > e.Count || e.FF <= 0 || e.SharedFF < 0:
		return fmt.Errorf("experts %+v: want 0 < used <= count and a positive width", e)
	case f == Qwen3MoE && e.SharedFF > 0 || f == GPTOSS && e.SharedFF > 0 || f == Qwen3Next && e.SharedFF == 0:
		return fmt.Errorf("a shared expert is for %s (always) and %s only", Qwen3Next, GLM4MoE)
	case f == GLM4MoE && e.SharedFF%e.FF != 0:
		return fmt.Errorf("%s's shared expert width %d is not a multiple of the expert width %d", f, e.SharedFF, e.FF)
	case e.DenseLead < 0 || e.DenseLead > 0 && f != GLM4MoE || e.DenseLead >= layers:
		return fmt.Errorf("leading dense layers (%d) are for %s only, and fewer than the layers", e.DenseLead, GLM4MoE)
	}
	return nil
}

// familyKV adds the keys of s's family to kv (none for Llama).
func (s Spec) familyKV(kv ggml.KV) {
	a := s.Family.Arch()
	if a == string(Llama) {
		return
	}
	kv[a+".attention.key_length"] = uint32(s.HeadDim())
	kv[a+".attention.value_length"] = uint32(s.HeadDim())
	if e := s.Experts; e != nil {
		kv[a+".expert_count"] = uint32(e.Count)
		kv[a+".expert_used_count"] = uint32(e.Used)
		kv[a+".expert_feed_forward_length"] = uint32(e.FF)
		if e.SharedFF > 0 && s.Family == Qwen3Next {
			kv[a+".expert_shared_feed_forward_length"] = uint32(e.SharedFF)
		}
		if s.Family == GLM4MoE {
			kv[a+".expert_shared_count"] = uint32(e.SharedFF / e.FF)
			kv[a+".leading_dense_block_count"] = uint32(e.DenseLead)
			kv[a+".expert_weights_scale"] = float32(1)
			kv[a+".expert_weights_norm"] = true
			kv[a+".expert_gating_func"] = uint32(glmSigmoidGating)
		}
	}
	if w := s.Window; w != nil {
		kv[a+".attention.sliding_window"] = uint32(w.Size)
	}
	if d := s.DeltaNet; d != nil {
		kv[a+".ssm.conv_kernel"] = uint32(d.ConvKernel)
		kv[a+".ssm.inner_size"] = uint32(d.valueDim())
		kv[a+".ssm.state_size"] = uint32(d.StateSize)
		kv[a+".ssm.time_step_rank"] = uint32(d.VHeads)
		kv[a+".ssm.group_count"] = uint32(d.KHeads)
	}
}

// familyParams counts the values of every tensor (the token embedding once when the
// output projection is tied).
func (s Spec) familyParams() int64 {
	var n int64
	for _, t := range familyTensors(s) {
		m := int64(1)
		for _, d := range t.Shape {
			m *= int64(d)
		}
		n += m
	}
	return n
}

package ggufsynth

import (
	"fmt"
	"math"

	"github.com/ollama/ollama/fs/ggml"
)

// Scales of the pseudo-random vectors that are not norms: biases and attention sinks
// small beside a unit-variance activation; the delta-net decay's log (ssm_a) in
// [-1.5, -0.5], negative as in trained models (a positive one grows the state without
// bound).
const (
	biasScale  = 0.1
	sinkScale  = 1
	decayScale = 0.5
	decayShift = -1
)

// tensorList collects the tensors of a family's model in the order GGUF files list
// them.
type tensorList struct {
	s  Spec
	ts []*ggml.Tensor
}

// matrix adds a weight matrix (or a stack of expert matrices) in the spec's type:
// uniform in ±sqrt(3/cols), unit-variance outputs.
func (l *tensorList) matrix(name string, shape ...uint64) {
	scale := float32(math.Sqrt(3 / float64(shape[0])))
	l.ts = append(l.ts, newTensor(l.s, name, l.s.DType, shape, scale))
}

// norm adds a norm's weights: F32 ones.
func (l *tensorList) norm(name string, n uint64) {
	l.ts = append(l.ts, newTensor(l.s, name, F32, []uint64{n}, 0))
}

// vector adds an F32 tensor of pseudo-random values in shift ± scale.
func (l *tensorList) vector(name string, scale, shift float32, shape ...uint64) {
	t := newTensor(l.s, name, F32, shape, scale)
	t.WriterTo.(*weights).shift = shift
	l.ts = append(l.ts, t)
}

// familyTensors are the tensors of a model of a family other than Llama, with the
// names and shapes llama.cpp's loader asks for.
func familyTensors(s Spec) []*ggml.Tensor {
	l := &tensorList{s: s}
	e := uint64(s.Embd)
	l.matrix("token_embd.weight", e, uint64(s.Vocab))
	l.norm("output_norm.weight", e)
	if s.Untied {
		l.matrix("output.weight", e, uint64(s.Vocab))
	}
	for i := range s.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		l.norm(p+"attn_norm.weight", e)
		if s.Recurrent(i) {
			l.deltaNet(p)
		} else {
			l.attention(p)
		}
		l.feedForward(p, i)
	}
	return l.ts
}

// attention adds an attention layer's projections, with the family's extras: query
// and key norms (all but GPTOSS and GLM4MoE), Qwen3Next's output gate (a query twice
// as wide), GPTOSS's biases and sinks, GLM4MoE's biases, Gemma3's norm after
// attention.
func (l *tensorList) attention(p string) {
	s := l.s
	e, hd := uint64(s.Embd), uint64(s.HeadDim())
	q, kv := hd*uint64(s.Heads), hd*uint64(s.KVHeads)
	qOut := q
	if s.Family == Qwen3Next {
		qOut = 2 * q
	}
	l.matrix(p+"attn_q.weight", e, qOut)
	l.matrix(p+"attn_k.weight", e, kv)
	l.matrix(p+"attn_v.weight", e, kv)
	l.matrix(p+"attn_output.weight", q, e)
	switch s.Family {
	case GPTOSS:
		l.vector(p+"attn_sinks.weight", sinkScale, 0, uint64(s.Heads))
		l.vector(p+"attn_q.bias", biasScale, 0, q)
		l.vector(p+"attn_k.bias", biasScale, 0, kv)
		l.vector(p+"attn_v.bias", biasScale, 0, kv)
		l.vector(p+"attn_output.bias", biasScale, 0, e)
		return
	case GLM4MoE:
		l.vector(p+"attn_q.bias", biasScale, 0, q)
		l.vector(p+"attn_k.bias", biasScale, 0, kv)
		l.vector(p+"attn_v.bias", biasScale, 0, kv)
		return
	}
	l.norm(p+"attn_q_norm.weight", hd)
	l.norm(p+"attn_k_norm.weight", hd)
	if s.Family == Gemma3 {
		l.norm(p+"post_attention_norm.weight", e)
	}
}

// deltaNet adds a gated delta-net layer: the fused query/key/value/gate input
// projection, the short convolution, the decay (ssm_a, ssm_dt), the beta/alpha
// projection, the per-head norm and the output projection.
func (l *tensorList) deltaNet(p string) {
	s, d := l.s, *l.s.DeltaNet
	e := uint64(s.Embd)
	kd, vd, vh := uint64(d.keyDim()), uint64(d.valueDim()), uint64(d.VHeads)
	conv := uint64(d.ConvKernel)
	l.matrix(p+"ssm_in.weight", e, 2*kd+2*vd)
	l.vector(p+"ssm_conv1d.weight", float32(math.Sqrt(3/float64(conv))), 0, conv, 2*kd+vd)
	l.vector(p+"ssm_dt.bias", biasScale, 0, vh)
	l.vector(p+"ssm_a", decayScale, decayShift, vh)
	l.matrix(p+"ssm_ba.weight", e, 2*vh)
	l.norm(p+"ssm_norm.weight", uint64(d.StateSize))
	l.matrix(p+"ssm_out.weight", vd, e)
}

// feedForward adds layer il's feed-forward part: Gemma3's dense SwiGLU between its
// two norms, or behind the family's norm GLM4MoE's leading dense layers and the
// routed experts (Qwen3Next's and GLM4MoE's with a shared expert, GPTOSS's with
// biases, GLM4MoE's with a per-expert gating bias).
func (l *tensorList) feedForward(p string, il int) {
	s := l.s
	e := uint64(s.Embd)
	if s.Family == Gemma3 {
		l.norm(p+"ffn_norm.weight", e)
		l.dense(p)
		l.norm(p+"post_ffw_norm.weight", e)
		return
	}
	if s.Family == Qwen3MoE {
		l.norm(p+"ffn_norm.weight", e)
	} else {
		l.norm(p+"post_attention_norm.weight", e)
	}
	if il < s.Experts.DenseLead {
		l.dense(p)
		return
	}
	x := *s.Experts
	n, ff := uint64(x.Count), uint64(x.FF)
	l.matrix(p+"ffn_gate_inp.weight", e, n)
	l.matrix(p+"ffn_gate_exps.weight", e, ff, n)
	l.matrix(p+"ffn_down_exps.weight", ff, e, n)
	l.matrix(p+"ffn_up_exps.weight", e, ff, n)
	switch s.Family {
	case GPTOSS:
		l.vector(p+"ffn_gate_inp.bias", biasScale, 0, n)
		l.vector(p+"ffn_gate_exps.bias", biasScale, 0, ff, n)
		l.vector(p+"ffn_down_exps.bias", biasScale, 0, e, n)
		l.vector(p+"ffn_up_exps.bias", biasScale, 0, ff, n)
	case GLM4MoE:
		l.vector(p+"exp_probs_b.bias", biasScale, 0, n)
		sff := uint64(x.SharedFF)
		l.matrix(p+"ffn_gate_shexp.weight", e, sff)
		l.matrix(p+"ffn_down_shexp.weight", sff, e)
		l.matrix(p+"ffn_up_shexp.weight", e, sff)
	case Qwen3Next:
		sff := uint64(x.SharedFF)
		l.vector(p+"ffn_gate_inp_shexp.weight", float32(math.Sqrt(3/float64(e))), 0, e)
		l.matrix(p+"ffn_gate_shexp.weight", e, sff)
		l.matrix(p+"ffn_up_shexp.weight", e, sff)
		l.matrix(p+"ffn_down_shexp.weight", sff, e)
	}
}

// dense adds a dense SwiGLU feed-forward of width FF.
func (l *tensorList) dense(p string) {
	e, ff := uint64(l.s.Embd), uint64(l.s.FF)
	l.matrix(p+"ffn_gate.weight", e, ff)
	l.matrix(p+"ffn_up.weight", e, ff)
	l.matrix(p+"ffn_down.weight", ff, e)
}

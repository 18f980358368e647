package ggufsynth

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	parser "github.com/gpustack/gguf-parser-go"
)

// familyKeys are the metadata a family's model carries beyond the dense ones, as a
// GGUF parser reads them back.
type familyKeys struct {
	Arch                                string
	KeyLength                           uint32
	Experts, ExpertsUsed                uint32
	ExpertFF, SharedFF                  uint64
	Window                              uint64
	SSMConv, SSMInner, SSMState, SSMDT  uint32
	SSMGroups                           uint32
	Layers                              uint64
	Tensors, ExpertTensors, DeltaTensor int
}

func TestFamiliesParseBack(t *testing.T) {
	want := map[Family]familyKeys{
		Llama: {Arch: "llama", Layers: 2, Tensors: 2 + 9*2},
		// ExpertTensors: the three routed stacks per layer (with gpt-oss's biases,
		// Qwen3Next's four shared-expert tensors).
		Qwen3MoE: {Arch: "qwen3moe", KeyLength: 32, Experts: 8, ExpertsUsed: 2, ExpertFF: 64, Layers: 2, Tensors: 2 + 12*2, ExpertTensors: 2 * 3},
		GPTOSS: {Arch: "gpt-oss", KeyLength: 64, Experts: 8, ExpertsUsed: 2, ExpertFF: 64, Window: tinyWindow, Layers: 2,
			Tensors: 3 + 19*2, ExpertTensors: 2 * 6},
		// One dense layer (attn_norm, 4 projections, 3 biases, post_attention_norm, 3
		// feed-forward), two of experts (the same attention, router, 3 stacks, gating
		// bias, 3 shared-expert tensors).
		GLM4MoE: {Arch: "glm4moe", KeyLength: 32, Experts: 8, ExpertsUsed: 2, ExpertFF: 64, Layers: 3,
			Tensors: 3 + 12 + 2*17, ExpertTensors: 2 * 6},
		Gemma3: {Arch: "gemma3", KeyLength: 32, Window: tinyWindow, Layers: 6, Tensors: 3 + 13*6},
		// Three delta-net layers (attn_norm, 7 ssm tensors) and one attention layer
		// (attn_norm, 6), each with post_attention_norm, 4 routed and 4 shared-expert tensors.
		Qwen3Next: {Arch: "qwen3next", KeyLength: 32, Experts: 8, ExpertsUsed: 2, ExpertFF: 64, SharedFF: 128,
			SSMConv: 4, SSMInner: 128, SSMState: 32, SSMDT: 4, SSMGroups: 2, Layers: 4,
			Tensors: 2 + 3*(1+7+9) + (1 + 6 + 9), ExpertTensors: 4 * 7, DeltaTensor: 3},
	}
	for _, f := range Families {
		t.Run(f.Arch(), func(t *testing.T) {
			spec, err := TinyFamily(f)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "m.gguf")
			if err := Write(path, spec); err != nil {
				t.Fatal(err)
			}
			gf, err := parser.ParseGGUFFile(path)
			if err != nil {
				t.Fatalf("parsing written model: %v", err)
			}
			a := gf.Architecture()
			got := familyKeys{Arch: a.Architecture, KeyLength: a.AttentionKeyLength, Experts: a.ExpertCount,
				ExpertsUsed: a.ExpertUsedCount, ExpertFF: a.ExpertFeedForwardLength, SharedFF: a.ExpertSharedFeedForwardLength,
				Window: a.AttentionSlidingWindow, SSMConv: a.SSMConvolutionKernel, SSMInner: a.SSMInnerSize,
				SSMState: a.SSMStateSize, SSMDT: a.SSMTimeStepRank, SSMGroups: a.SSMGroupCount, Layers: a.BlockCount,
				Tensors: len(gf.TensorInfos)}
			if f == Llama {
				got.KeyLength = 0 // the parser derives it; Llama files do not carry it
			}
			for _, ti := range gf.TensorInfos {
				switch {
				case strings.Contains(ti.Name, "_exps.") || strings.Contains(ti.Name, "_shexp"):
					got.ExpertTensors++
				case strings.HasSuffix(ti.Name, ".ssm_in.weight"):
					got.DeltaTensor++
				}
			}
			if d := cmp.Diff(want[f], got); d != "" {
				t.Errorf("parsed metadata (-want +got):\n%s", d)
			}
			if n := spec.Params(); n <= 0 || float64(gf.Size) < float64(n)*4 {
				t.Errorf("params %d for a %d-byte F32 file", n, gf.Size)
			}
		})
	}
}

// The expert and delta-net tensors have the shapes llama.cpp's loader asks for.
func TestFamilyTensorShapes(t *testing.T) {
	moe, _ := TinyFamily(Qwen3MoE)
	oss, _ := TinyFamily(GPTOSS)
	glm, _ := TinyFamily(GLM4MoE)
	next, _ := TinyFamily(Qwen3Next)
	tests := []struct {
		spec   Spec
		tensor string
		want   []uint64
	}{
		{moe, "blk.1.ffn_gate_inp.weight", []uint64{128, 8}},
		{moe, "blk.1.ffn_gate_exps.weight", []uint64{128, 64, 8}},
		{moe, "blk.1.ffn_down_exps.weight", []uint64{64, 128, 8}},
		{moe, "blk.0.attn_q_norm.weight", []uint64{32}},
		{glm, "blk.0.ffn_down.weight", []uint64{256, 128}},
		{glm, "blk.1.exp_probs_b.bias", []uint64{8}},
		{glm, "blk.2.ffn_down_shexp.weight", []uint64{64, 128}},
		{glm, "blk.2.attn_q.bias", []uint64{128}},
		{oss, "blk.0.attn_q.weight", []uint64{128, 4 * 64}},
		{oss, "blk.0.attn_output.weight", []uint64{4 * 64, 128}},
		{oss, "blk.0.attn_sinks.weight", []uint64{4}},
		{oss, "blk.0.ffn_up_exps.bias", []uint64{64, 8}},
		{oss, "output.weight", []uint64{128, 512}},
		{next, "blk.3.attn_q.weight", []uint64{128, 2 * 4 * 32}},
		{next, "blk.0.ssm_in.weight", []uint64{128, 2*64 + 2*128}},
		{next, "blk.0.ssm_conv1d.weight", []uint64{4, 2*64 + 128}},
		{next, "blk.2.ssm_a", []uint64{4}},
		{next, "blk.2.ssm_ba.weight", []uint64{128, 8}},
		{next, "blk.2.ssm_out.weight", []uint64{128, 128}},
		{next, "blk.0.ffn_gate_inp_shexp.weight", []uint64{128}},
		{next, "blk.0.ffn_down_shexp.weight", []uint64{128, 128}},
	}
	for _, tt := range tests {
		got, ok := tt.spec.TensorShapes()[tt.tensor]
		if !ok || !cmp.Equal(got, tt.want) {
			t.Errorf("%s %s: shape %v (present %t), want %v", tt.spec.Family, tt.tensor, got, ok, tt.want)
		}
	}
	if _, ok := next.TensorShapes()["blk.3.ssm_in.weight"]; ok {
		t.Error("qwen3next layer 3 is an attention layer, yet it has delta-net tensors")
	}
	if _, ok := next.TensorShapes()["blk.2.attn_q.weight"]; ok {
		t.Error("qwen3next layer 2 is a delta-net layer, yet it has attention tensors")
	}
}

// The delta-net decay is negative everywhere, and each family's file is the same
// bytes every time.
func TestFamilyWeights(t *testing.T) {
	next, _ := TinyFamily(Qwen3Next)
	for _, tn := range familyTensors(next) {
		if tn.Name != "blk.0.ssm_a" {
			continue
		}
		vals := make([]float32, 4)
		tn.WriterTo.(*weights).values(vals, 0)
		for _, v := range vals {
			if v >= -0.5 || v < -1.5 {
				t.Errorf("ssm_a value %v outside [-1.5, -0.5)", v)
			}
		}
	}
	for _, f := range Families[1:] {
		spec, _ := TinyFamily(f)
		dir := t.TempDir()
		a, b := filepath.Join(dir, "a.gguf"), filepath.Join(dir, "b.gguf")
		if err := Write(a, spec); err != nil {
			t.Fatal(err)
		}
		if err := Write(b, spec); err != nil {
			t.Fatal(err)
		}
		ab, _ := os.ReadFile(a)
		bb, _ := os.ReadFile(b)
		if !bytes.Equal(ab, bb) {
			t.Errorf("%s: two writes differ", f)
		}
		if len(ab) > 8<<20 {
			t.Errorf("%s: tiny model is %d bytes, want under 8 MiB", f, len(ab))
		}
	}
}

func TestValidateFamily(t *testing.T) {
	tiny := func(f Family, edit func(*Spec)) Spec {
		s, err := TinyFamily(f)
		if err != nil {
			t.Fatal(err)
		}
		edit(&s)
		return s
	}
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"unknown family", tiny(Llama, func(s *Spec) { s.Family = "mamba" }), "not one of"},
		{"moe without experts", tiny(Qwen3MoE, func(s *Spec) { s.Experts = nil }), "needs experts true"},
		{"dense with experts", tiny(Gemma3, func(s *Spec) { s.Experts = &Experts{Count: 2, Used: 1, FF: 32} }), "needs experts false"},
		{"more used than experts", tiny(Qwen3MoE, func(s *Spec) { s.Experts.Used = 9 }), "used <= count"},
		{"shared expert outside qwen3next", tiny(Qwen3MoE, func(s *Spec) { s.Experts.SharedFF = 32 }), "shared expert"},
		{"window past the context", tiny(Gemma3, func(s *Spec) { s.Window.Size = s.Ctx }), "below the context"},
		{"tied gpt-oss", tiny(GPTOSS, func(s *Spec) { s.Untied = false }), "untied"},
		{"value heads not a multiple", tiny(Qwen3Next, func(s *Spec) { s.DeltaNet.VHeads = 3 }), "not a multiple"},
		{"glm shared expert not a multiple", tiny(GLM4MoE, func(s *Spec) { s.Experts.SharedFF = 96 }), "not a multiple of the expert width"},
		{"leading dense layers outside glm", tiny(Qwen3MoE, func(s *Spec) { s.Experts.DenseLead = 1 }), "leading dense layers"},
		{"hybrid without an attention layer", tiny(Qwen3Next, func(s *Spec) { s.Layers = 3 }), "at least 4 layers"},
		{"reply on a family", tiny(Gemma3, func(s *Spec) { s.Untied, s.Reply = true, &Reply{Token: 300, End: EOSToken} }), "steered"},
		{"quantized rows", tiny(Qwen3MoE, func(s *Spec) { s.DType, s.Experts.FF = Q8_0, 40 }), "not a multiple of 32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.spec.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := TinyFamily("mamba"); err == nil {
		t.Error("TinyFamily(mamba) succeeded")
	}
	for _, s := range []Spec{Qwen3MoE30BA3B(Q4_0), GPTOSS20B(Q4_0), Qwen3MoE30BA3B(F16), GLM45Air(Q4_0)} {
		if err := s.Validate(); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
	}
}

// The real-shaped presets have their models' parameter counts.
func TestRealShapes(t *testing.T) {
	for _, tt := range []struct {
		spec     Spec
		min, max float64 // billions
	}{
		{Qwen3MoE30BA3B(Q4_0), 30, 31.5},
		{GPTOSS20B(Q4_0), 20, 22.5},
		{GLM45Air(Q4_0), 100, 110},
	} {
		b := float64(tt.spec.Params()) / 1e9
		t.Logf("%s: %.2f billion parameters", tt.spec.Name, b)
		if b < tt.min || b > tt.max {
			t.Errorf("%s: %.2f billion parameters, want %.1f to %.1f", tt.spec.Name, b, tt.min, tt.max)
		}
	}
}

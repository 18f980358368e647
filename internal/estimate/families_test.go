package estimate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	gguf "github.com/gpustack/gguf-parser-go"
	"github.com/ollama/ollama/fs/ggml"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// tinyQwen3Next is ggufsynth's tiny hybrid: 4 layers (3 delta-net, 1 attention),
// conv kernel 4, state 32, 2 key heads and 4 value heads (inner size 128).
var tinyQwen3Next = hybrid{Layers: 4, Interval: 4, ConvKernel: 4, InnerSize: 128, StateSize: 32, Groups: 2, Heads: 4}

// qwen3Next80B is Qwen3-Next-80B-A3B's: 48 layers (36 delta-net, 12 attention), conv
// kernel 4, state 128, 16 key heads and 32 value heads (inner size 4096).
var qwen3Next80B = hybrid{Layers: 48, Interval: 4, ConvKernel: 4, InnerSize: 4096, StateSize: 128, Groups: 16, Heads: 32}

func TestHybridState(t *testing.T) {
	for _, tc := range []struct {
		name       string
		h          hybrid
		seqs       int64
		attn, recr int64
		conv, st   int64
		state      int64
	}{
		// conv row 3 × (128 + 2×2×32) = 768, state row 32 × 128 = 4096; 3 layers ×
		// (768 + 4096) × 4 bytes = 58368 (llama.cpp logs R 0.01 MiB, S 0.05 MiB).
		{name: "tiny", h: tinyQwen3Next, seqs: 1, attn: 1, recr: 3, conv: 768, st: 4096, state: 58368},
		// Parallel multiplies it; zero sequences are one (llama.cpp's max(1, n_seq_max)).
		{name: "tiny, 4 slots", h: tinyQwen3Next, seqs: 4, attn: 1, recr: 3, conv: 768, st: 4096, state: 4 * 58368},
		{name: "tiny, no slots", h: tinyQwen3Next, seqs: 0, attn: 1, recr: 3, conv: 768, st: 4096, state: 58368},
		// conv row 3 × (4096 + 2×16×128) = 24576, state row 128 × 4096 = 524288; 36
		// layers × (24576 + 524288) × 4 bytes = 79036416 per slot.
		{name: "80B-A3B", h: qwen3Next80B, seqs: 1, attn: 12, recr: 36, conv: 24576, st: 524288, state: 79036416},
		{name: "80B-A3B, 4 slots", h: qwen3Next80B, seqs: 4, attn: 12, recr: 36, conv: 24576, st: 524288, state: 316145664},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := []int64{tc.h.attentionLayers(), tc.h.recurrentLayers(), tc.h.convRow(), tc.h.stateRow(), tc.h.recurrentState(tc.seqs)}
			want := []int64{tc.attn, tc.recr, tc.conv, tc.st, tc.state}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("attention layers, recurrent layers, conv row, state row, state (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKVShape(t *testing.T) {
	for _, tc := range []struct {
		name          string
		s             kvShape
		layers, cells int64
		typ           gguf.GGMLType
		want          int64
	}{
		// 2 layers × 2 heads × 32 × (K + V) × 2 bytes = 512 bytes a cell.
		{name: "tiny f16", s: kvShape{2, 32, 32}, layers: 2, cells: 1024, typ: gguf.GGMLTypeF16, want: 512 << 10},
		// q8_0: 34 bytes per 32 values.
		{name: "tiny q8_0", s: kvShape{2, 32, 32}, layers: 2, cells: 1024, typ: gguf.GGMLTypeQ8_0, want: 2 * 2 * 34 * 2 * 1024},
		// Qwen3-Next's 12 attention layers × 2 heads × 256 × 2 × 2 bytes = 24576 a cell.
		{name: "80B-A3B", s: kvShape{2, 256, 256}, layers: 12, cells: 32768, typ: gguf.GGMLTypeF16, want: 805306368},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.kvCache(tc.layers, tc.cells, tc.typ); got != tc.want {
				t.Errorf("kvCache = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestGraph(t *testing.T) {
	for _, tc := range []struct {
		arch            string
		tensors, tokens int64
		want            int64
	}{
		{arch: "llama", tensors: 20, tokens: 512, want: 1024},
		{arch: "gemma3", tensors: 400, tokens: 512, want: 3200},
		// A hybrid: max(40 × tokens, 32 × tensors).
		{arch: "qwen3next", tensors: 69, tokens: 512, want: 20480},
		{arch: "qwen3next", tensors: 843, tokens: 512, want: 26976},
	} {
		if got := graphNodes(tc.arch, tc.tensors, tc.tokens); got != tc.want {
			t.Errorf("graphNodes(%s, %d, %d) = %d, want %d", tc.arch, tc.tensors, tc.tokens, got, tc.want)
		}
	}
	// Two graphs, each a tensor's overhead per node and its tables.
	one := int64(gguf.GGMLTensorOverhead()*20480 + gguf.GGMLComputationGraphOverhead(20480, false))
	if got := graphMeta(20480); got != 2*one || one < 20480*368 {
		t.Errorf("graphMeta(20480) = %d, want two graphs of %d (at least 368 bytes a node)", got, one)
	}
}

func TestDeltaNetCompute(t *testing.T) {
	// 512 tokens (8 chunks): 4 × 512 × (2×2×32 + 2×128) × 4 = 3 MiB of projections
	// and 4 × 64 × 512 × 4 heads × 4 = 2 MiB of chunk matrices.
	if got, want := tinyQwen3Next.deltaNetCompute(512), int64(5<<20); got != want {
		t.Errorf("tiny deltaNetCompute(512) = %d, want %d", got, want)
	}
	// 1 token pads to a chunk: 4 × 64 × 384 × 4 + 4 × 64 × 64 × 4 × 4.
	if got, want := tinyQwen3Next.deltaNetCompute(1), int64(4*64*384*4+4*64*64*4*4); got != want {
		t.Errorf("tiny deltaNetCompute(1) = %d, want %d", got, want)
	}
}

// qwen3Next80BA3B is Qwen3-Next-80B-A3B's shape (48 layers, every fourth attention
// with 16 query / 2 KV heads of 256; 512 experts of which 10 per token and a shared
// one; delta-net conv kernel 4, state 128, 16 key and 32 value heads).
func qwen3Next80BA3B(dt ggufsynth.DType) ggufsynth.Spec {
	return ggufsynth.Spec{Name: "macfleet-qwen3next-80b-a3b-" + string(dt), Family: ggufsynth.Qwen3Next, Vocab: 151936,
		Embd: 2048, Layers: 48, Heads: 16, KVHeads: 2, KeyLength: 256, FF: 5120, Ctx: 262144, DType: dt, Untied: true,
		RopeBase: 1e7, Seed: 1, Experts: &ggufsynth.Experts{Count: 512, Used: 10, FF: 512, SharedFF: 512},
		DeltaNet: &ggufsynth.DeltaNet{ConvKernel: 4, StateSize: 128, KHeads: 16, VHeads: 32}}
}

func tinyFamily(t *testing.T, f ggufsynth.Family) ggufsynth.Spec {
	t.Helper()
	s, err := ggufsynth.TinyFamily(f)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFamilyMemory estimates each family's header (tiny, and real-shaped as Q4_0,
// written header-only) and checks what it counts: Weights are the sum of every
// tensor's size as another GGUF reader sees them (and the file's padding), experts
// included (their hand sum below: layers × 3 matrices × embd × expert FF × experts,
// 18 bytes per 32 values); KVCache and Recurrent are the formulas of families.go,
// hand-computed per case.
func TestFamilyMemory(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name          string
		spec          ggufsynth.Spec
		ctx, parallel int32
		kv, recurrent int64
		experts       int64
	}{
		// The tiny models at 1024 cells: llama.cpp logs the same KV and RS buffers.
		// 2 layers × 2 heads × 32 × 2 × 2 bytes = 512 bytes a cell.
		{name: "tiny llama", spec: tinyFamily(t, ggufsynth.Llama), ctx: 1024, kv: 512 << 10},
		{name: "tiny qwen3moe", spec: tinyFamily(t, ggufsynth.Qwen3MoE), ctx: 1024, kv: 512 << 10},
		// 2 layers (one a 32-token window, full-size) × 2 heads × 64 × 2 × 2 = 1024.
		{name: "tiny gpt-oss", spec: tinyFamily(t, ggufsynth.GPTOSS), ctx: 1024, kv: 1 << 20},
		// 3 layers × 2 × 32 × 2 × 2 = 768.
		{name: "tiny glm4moe", spec: tinyFamily(t, ggufsynth.GLM4MoE), ctx: 1024, kv: 768 << 10},
		// 6 layers (five windowed, full-size) × 2 × 32 × 2 × 2 = 1536.
		{name: "tiny gemma3", spec: tinyFamily(t, ggufsynth.Gemma3), ctx: 1024, kv: 1536 << 10},
		// 1 attention layer × 256 = 256 a cell; 3 delta-net layers' states of 58368
		// bytes a slot (TestHybridState), times 2 slots.
		{name: "tiny qwen3next", spec: tinyFamily(t, ggufsynth.Qwen3Next), ctx: 1024, parallel: 2, kv: 256 << 10,
			recurrent: 2 * 58368},
		// Real-shaped at 32768 cells. 48 layers × 4 heads × 128 × 2 × 2 = 98304 bytes a
		// cell: 3 GiB; experts 48 × 3 × 2048 × 768 × 128 × 18/32.
		{name: "Qwen3-Coder-30B-A3B", spec: ggufsynth.Qwen3MoE30BA3B(ggufsynth.Q4_0), ctx: 32768,
			kv: 3221225472, experts: 16307453952},
		// 24 layers (12 of a 128-token window, full-size) × 8 × 64 × 2 × 2 = 49152 a
		// cell: 1.5 GiB; experts 24 × 3 × 2880 × 2880 × 32 × 18/32.
		{name: "gpt-oss-20b", spec: ggufsynth.GPTOSS20B(ggufsynth.Q4_0), ctx: 32768, kv: 1610612736, experts: 10749542400},
		// 46 layers × 8 × 128 × 2 × 2 = 188416 a cell; experts on 45 layers: 45 × 3 ×
		// 4096 × 1408 × 128 × 18/32.
		{name: "GLM-4.5-Air", spec: ggufsynth.GLM45Air(ggufsynth.Q4_0), ctx: 32768, kv: 6174015488, experts: 56056872960},
		// 12 attention layers × 2 × 256 × 2 × 2 = 24576 a cell (TestKVShape); 36
		// delta-net layers, 4 slots: 316145664 (TestHybridState); experts 48 × 3 × 2048
		// × 512 × 512 × 18/32.
		{name: "Qwen3-Next-80B-A3B", spec: qwen3Next80BA3B(ggufsynth.Q4_0), ctx: 32768, parallel: 4,
			kv: 805306368, recurrent: 316145664, experts: 43486543872},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, tc.spec.Name+".gguf")
			if err := ggufsynth.WriteHeader(path, tc.spec); err != nil {
				t.Fatal(err)
			}
			r, err := Estimate(t.Context(), Params{Path: path, ContextLength: tc.ctx, Parallel: tc.parallel})
			if err != nil {
				t.Fatal(err)
			}
			weights, tensors, experts := tensorBytes(t, path)
			// The file pads each tensor's data to its alignment (32 bytes).
			if r.Weights < weights || r.Weights > weights+32*tensors {
				t.Errorf("weights %d, the %d tensors sum to %d (up to 32 bytes of padding each)", r.Weights, tensors, weights)
			}
			if tc.experts != 0 && experts != tc.experts {
				t.Errorf("expert tensors %d bytes, want %d", experts, tc.experts)
			}
			if r.KVCache != tc.kv || r.Recurrent != tc.recurrent {
				t.Errorf("KV cache %d and recurrent state %d, want %d and %d", r.KVCache, r.Recurrent, tc.kv, tc.recurrent)
			}
			if sum := r.Weights + r.KVCache + r.Recurrent + r.Compute + r.Overhead; r.Total != sum {
				t.Errorf("total %d, its parts sum to %d", r.Total, sum)
			}
		})
	}
}

// tensorBytes reads path's tensors with another GGUF reader: the sum of their sizes,
// their count and the sum of the routed experts' matrices.
func tensorBytes(t *testing.T, path string) (all, count, experts int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range g.Tensors().Items() {
		all, count = all+int64(ts.Size()), count+1
		if strings.HasSuffix(ts.Name, "_exps.weight") {
			experts += int64(ts.Size())
		}
	}
	return all, count, experts
}

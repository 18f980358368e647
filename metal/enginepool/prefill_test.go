package enginepool

import (
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPrefillPeak(t *testing.T) {
	small := ModelDims{Layers: 8, Embedding: 1024, Heads: 16, KVHeads: 4, Vocab: 32000, KVTypeSize: 2}
	for _, tc := range []struct {
		name   string
		dims   ModelDims
		tokens int
		want   int64
	}{
		// head dim 64; KV 2·8·1000·4·64·2 = 8,192,000; scores 16·512·1000·4 =
		// 32,768,000; activations 512·1024·4·8 = 16,777,216; logits 128,000.
		{name: "1000 tokens, GQA, f16", dims: small, tokens: 1000, want: 8_192_000 + 32_768_000 + 16_777_216 + 128_000},
		// chunk = 100: scores 16·100·100·4, activations 100·1024·32.
		{name: "short prompt", dims: small, tokens: 100, want: 819_200 + 640_000 + 3_276_800 + 128_000},
		{name: "no KV head count means MHA", dims: ModelDims{Layers: 1, Embedding: 64, Heads: 2, KVTypeSize: 2}, tokens: 10,
			want: 2*1*10*2*32*2 + 2*10*10*4 + 10*64*32},
		{name: "no KV size means f16", dims: ModelDims{Layers: 1, Embedding: 64, Heads: 2, KVHeads: 2}, tokens: 10,
			want: 2*1*10*2*32*2 + 2*10*10*4 + 10*64*32},
		{name: "q8_0 KV", dims: ModelDims{Layers: 1, Embedding: 64, Heads: 2, KVHeads: 2, KVTypeSize: 1.0625}, tokens: 10,
			want: 1360 + 2*10*10*4 + 10*64*32},
		{name: "no tokens", dims: small, tokens: 0, want: 0},
		{name: "unknown dimensions", dims: ModelDims{}, tokens: 1000, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PrefillPeak(tc.dims, tc.tokens); got != tc.want {
				t.Fatalf("PrefillPeak = %d, want %d", got, tc.want)
			}
		})
	}
	if PrefillPeak(small, 8000) <= PrefillPeak(small, 4000) {
		t.Fatal("the peak must grow with the prompt")
	}
}

// The prefill guard rejects a prompt whose peak would take the host over its hard
// watermark, with a 413 carrying the estimate and the limit.
func TestCheckPrefill(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 8, OnDemand)
	h.load("a")
	h.p.enforcer.poll() // usage 8 GiB; hard 9.5 GiB: 1.5 GiB of headroom

	dims := h.model("a").Spec.Dims
	if err := h.p.CheckPrefill("a", 1000); err != nil {
		t.Fatalf("a 1000-token prompt: %v", err)
	}
	tokens := 40000 // ≈ 1.54 GiB of scores, KV and activations
	peak := PrefillPeak(dims, tokens)
	err := h.p.CheckPrefill("a", tokens)
	status, code := statusOf(t, err)
	if status != http.StatusRequestEntityTooLarge || code != CodePrefillMemoryExceeded {
		t.Fatalf("got %d %s (%v)", status, code, err)
	}
	se, _ := AsStatusError(err)
	hard := h.p.Snapshot().Ceiling.HardBytes
	if d := cmp.Diff(map[string]any{"estimated_bytes": peak, "limit_bytes": hard}, se.Fields()); d != "" {
		t.Fatalf("fields (-want +got):\n%s", d)
	}
	if err := h.p.CheckPrefill("nope", 1); err == nil {
		t.Fatal("unknown model accepted")
	} else if status, _ := statusOf(t, err); status != http.StatusNotFound {
		t.Fatalf("unknown model: %d", status)
	}
}

//go:build cgo && !race

package server

import "testing"

// TestFillersOn: fillers are on where the model has weights on an accelerator, or
// where its logits are more of a token's work than its layers, and MACFLEET_FILLERS=1
// or 0 sets them either way; any other value is not a setting.
func TestFillersOn(t *testing.T) {
	// The trained test model (vocab 128256, embd 160, tied; 22,981,280 parameters) and the
	// synthesized mid model (vocab 32000, embd 1024, tied; 91,505,664).
	trained := modelShape{params: 22_981_280, vocab: 128256, embd: 160}
	mid := modelShape{params: 91_505_664, vocab: 32000, embd: 1024}
	for _, tc := range []struct {
		env    string
		device uint64
		shape  modelShape
		want   bool
	}{
		{"", 0, mid, false}, {"", 1 << 30, mid, true},
		{"1", 0, mid, true}, {"1", 1 << 30, mid, true},
		{"0", 0, mid, false}, {"0", 1 << 30, mid, false},
		{"yes", 0, mid, false}, {"yes", 1 << 30, mid, true},
		{"", 0, trained, true}, {"0", 0, trained, false}, {"1", 0, trained, true},
		// Untied, the trained model's output projection counts as layers: no fillers.
		{"", 0, modelShape{params: trained.params + 128256*160, vocab: 128256, embd: 160}, false},
		// Logits exactly as much work as the layers: not more.
		{"", 0, modelShape{params: 2 * 1000 * 10, vocab: 1000, embd: 10}, false},
		// No shape read (zeros), or fewer parameters than the logits: no fillers.
		{"", 0, modelShape{}, false},
		{"", 0, modelShape{params: 10, vocab: 1000, embd: 10}, false},
	} {
		if got := fillersOn(tc.env, tc.device, tc.shape); got != tc.want {
			t.Errorf("fillersOn(%q, %d, %+v) = %v, want %v", tc.env, tc.device, tc.shape, got, tc.want)
		}
	}
}

// TestPadding: a step where one slot of the busy run drafts is padded to that slot's
// tokens, unless that would pass maxPadRows, the batch or a slot's stream; a step
// without a draft is not padded.
func TestPadding(t *testing.T) {
	for _, tc := range []struct {
		name         string
		takes, ends  []int
		nBatch, nCtx int
		want         int
	}{
		{"no draft: an idle slot's one filler", []int{1, 0, 1}, []int{10, 5, 12}, 512, 2048, 1},
		{"one slot drafts 4", []int{1, 0, 5}, []int{10, 5, 12}, 512, 2048, 5},
		{"the largest draft sets it", []int{3, 1, 9, 1}, []int{10, 10, 10, 10}, 512, 2048, 9},
		{"a single drafting slot needs no filler", []int{6}, []int{10}, 512, 2048, 6},
		{"sixteen slots by 4 tokens: 64 rows", []int{4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, make([]int, 16), 512, 2048, 4},
		{"sixteen slots by 5 tokens pass maxPadRows", []int{5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, make([]int, 16), 512, 2048, 1},
		{"past the batch", []int{9, 1, 1}, []int{10, 10, 10}, 20, 2048, 1},
		{"an idle slot's stream too full", []int{5, 0, 1}, []int{10, 2045, 10}, 512, 2048, 1},
		{"a busy slot's stream just full enough", []int{5, 1}, []int{10, 2043}, 512, 2048, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := padding(tc.takes, tc.ends, tc.nBatch, tc.nCtx); got != tc.want {
				t.Errorf("padding(%v, %v, %d, %d) = %d, want %d", tc.takes, tc.ends, tc.nBatch, tc.nCtx, got, tc.want)
			}
		})
	}
}

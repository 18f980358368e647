//go:build cgo && !race

package server

import "testing"

// TestFillersOn: fillers are on where the model has weights on an accelerator, and
// MACFLEET_FILLERS=1 or 0 sets them either way; any other value is not a setting.
func TestFillersOn(t *testing.T) {
	for _, tc := range []struct {
		env    string
		device uint64
		want   bool
	}{
		{"", 0, false}, {"", 1 << 30, true},
		{"1", 0, true}, {"1", 1 << 30, true},
		{"0", 0, false}, {"0", 1 << 30, false},
		{"yes", 0, false}, {"yes", 1 << 30, true},
	} {
		if got := fillersOn(tc.env, tc.device); got != tc.want {
			t.Errorf("fillersOn(%q, %d) = %v, want %v", tc.env, tc.device, got, tc.want)
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

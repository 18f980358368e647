package metering

import (
	"math"
	"testing"
)

func TestAddCount(t *testing.T) {
	for _, tc := range []struct{ a, b, want int64 }{
		{1, 2, 3},
		{0, 0, 0},
		{MaxCount - 1, 1, MaxCount},
		{MaxCount, 1, MaxCount},
		{1 << 62, 1 << 62, MaxCount},
		{math.MaxInt64, math.MaxInt64, MaxCount},
		{-5, 3, 3}, // a count is never negative
		{math.MinInt64, math.MinInt64, 0},
	} {
		if got := AddCount(tc.a, tc.b); got != tc.want {
			t.Errorf("AddCount(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
	if got := (Usage{Input: 1 << 62, Output: 1}).Add(Usage{Input: 1 << 62, Output: 2}); got != (Usage{Input: MaxCount, Output: 3}) {
		t.Errorf("Usage.Add = %+v, want the input saturated", got)
	}
}

package peerfetch

import (
	"fmt"
	"testing"
)

// TestVouched: a replica may serve a chain's prefixes up to the deepest one it was
// sent in that partition; nothing of another partition or another replica's; the
// oldest generation goes past the bound.
func TestVouched(t *testing.T) {
	v := NewVouched(4)
	v.Vouch("r1", "team-a", "d1", "d2", "d3")
	v.Vouch("r2", "team-b", "x1")
	for _, tc := range []struct {
		replica, partition string
		chain              []string
		want               int
	}{
		{"r1", "team-a", []string{"d1", "d2", "d3", "d4"}, 3},
		{"r1", "team-a", []string{"d1", "d2", "e3"}, 2},
		{"r1", "team-b", []string{"d1", "d2", "d3"}, 0},
		{"r2", "team-a", []string{"d1"}, 0},
		{"r3", "team-a", []string{"d1"}, 0},
		{"r2", "team-b", []string{"x1", "x2"}, 1},
	} {
		if got := v.Depth(tc.replica, tc.partition, tc.chain); got != tc.want {
			t.Errorf("Depth(%s, %s, %v) = %d, want %d", tc.replica, tc.partition, tc.chain, got, tc.want)
		}
	}
	for i := range 4 {
		v.Vouch("r1", "team-a", fmt.Sprintf("n%d", i))
	}
	if got := v.Depth("r1", "team-a", []string{"d1"}); got != 0 {
		t.Errorf("d1 after 4 newer prefixes (bound 4): depth %d, want 0 (forgotten)", got)
	}
	if got := v.Depth("r1", "team-a", []string{"n2"}); got != 1 {
		t.Errorf("n2, in the older generation: depth %d, want 1", got)
	}
	v.Forget("r2")
	if got := v.Depth("r2", "team-b", []string{"x1"}); got != 0 {
		t.Errorf("after Forget: depth %d, want 0", got)
	}
}

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

package metering

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/engine"
)

func TestLimitsBound(t *testing.T) {
	const slot = 4096 + SlotRounding
	for _, tc := range []struct {
		name string
		l    Limits
		want Usage
	}{
		{"a chat with max_tokens", Limits{Context: 4096, Sequences: 1, MaxTokens: 16, Generates: true},
			Usage{Input: slot, Cached: slot, Output: 16}},
		{"n choices", Limits{Context: 4096, Sequences: 3, MaxTokens: 16, Generates: true},
			Usage{Input: 3 * slot, Cached: 3 * slot, Output: 48}},
		{"no max_tokens: the context caps the output", Limits{Context: 4096, Sequences: 2, Generates: true},
			Usage{Input: 2 * slot, Cached: 2 * slot, Output: 2 * slot}},
		{"max_tokens beyond the context", Limits{Context: 4096, Sequences: 1, MaxTokens: 1 << 40, Generates: true},
			Usage{Input: slot, Cached: slot, Output: slot}},
		{"embeddings of 5 inputs", Limits{Context: 4096, Sequences: 5},
			Usage{Input: 5 * slot, Cached: 5 * slot}},
		{"count_tokens: no sequence", Limits{Context: 4096}, Usage{}},
		{"an unknown context", Limits{Sequences: 1, Generates: true},
			Usage{Input: engine.MaxContextLength + SlotRounding, Cached: engine.MaxContextLength + SlotRounding,
				Output: engine.MaxContextLength + SlotRounding}},
	} {
		if d := cmp.Diff(tc.want, tc.l.Bound()); d != "" {
			t.Errorf("%s: Bound (-want +got):\n%s", tc.name, d)
		}
	}
}

func TestClamp(t *testing.T) {
	b := Usage{Input: 100, Cached: 100, Output: 10}
	for _, tc := range []struct {
		name    string
		in      Usage
		want    Usage
		reasons []string
	}{
		{"within", Usage{Input: 100, Cached: 40, Output: 10}, Usage{Input: 100, Cached: 40, Output: 10}, nil},
		{"2^62 each", Usage{Input: 1 << 62, Cached: 1 << 62, Output: 1 << 62}, b,
			[]string{ClampInput, ClampOutput, ClampCached}},
		{"more cached than input", Usage{Input: 5, Cached: 50, Output: 1}, Usage{Input: 5, Cached: 5, Output: 1},
			[]string{ClampCached}},
		{"output only", Usage{Input: 1, Output: 11}, Usage{Input: 1, Output: 10}, []string{ClampOutput}},
		{"negative counts are 0", Usage{Input: -1, Cached: -1, Output: -1}, Usage{}, nil},
	} {
		got, reasons := Clamp(tc.in, b)
		if got != tc.want || !cmp.Equal(reasons, tc.reasons) {
			t.Errorf("%s: Clamp(%+v) = %+v %v, want %+v %v", tc.name, tc.in, got, reasons, tc.want, tc.reasons)
		}
	}
}

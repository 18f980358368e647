package routing

import (
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/prefixindex"
)

func TestChoosePrefix(t *testing.T) {
	hot := func(tokens, load int) prefixCandidate {
		return prefixCandidate{hit: prefixindex.Hit{Depth: 2, Held: prefixindex.Held{Tier: runnerapi.TierHot, Tokens: tokens}}, load: load, slots: 1}
	}
	ssd := func(tokens, load int) prefixCandidate {
		c := hot(tokens, load)
		c.hit.Tier = runnerapi.TierSSD
		return c
	}
	none := func(load int) prefixCandidate { return prefixCandidate{load: load, slots: 1} }
	all := func(n int) []bool {
		e := make([]bool, n)
		for i := range e {
			e[i] = true
		}
		return e
	}
	tests := []struct {
		name     string
		cands    []prefixCandidate
		eligible []bool
		want     int
	}{
		{name: "nobody holds anything: fall back", cands: []prefixCandidate{none(0), none(0)}, want: -1},
		{name: "the holder though busier than an idle replica", cands: []prefixCandidate{none(0), hot(1000, 1)}, want: 1},
		{name: "the longest held prefix", cands: []prefixCandidate{hot(1000, 0), hot(4000, 0), hot(2000, 0)}, want: 1},
		{name: "hot beats ssd of the same length", cands: []prefixCandidate{ssd(4000, 0), hot(4000, 0)}, want: 1},
		{name: "a much longer ssd prefix beats a short hot one", cands: []prefixCandidate{hot(1000, 0), ssd(8000, 0)}, want: 1},
		{name: "a loaded holder loses to an idle one holding nearly as much",
			cands: []prefixCandidate{hot(4000, 1), hot(3000, 0), none(0)}, want: 1},
		{name: "equal scores go to the less loaded",
			cands: []prefixCandidate{{hit: prefixindex.Hit{Depth: 1, Held: prefixindex.Held{Tier: "hot", Tokens: 100}}, load: 1, slots: 2},
				{hit: prefixindex.Hit{Depth: 1, Held: prefixindex.Held{Tier: "hot", Tokens: 100}}, load: 1, slots: 2}}, want: 0},
		{name: "over the load bound the holder spills: fall back",
			cands: []prefixCandidate{hot(8000, 3), none(0), none(0)}, want: -1},
		{name: "over the load bound another holder takes it",
			cands: []prefixCandidate{hot(8000, 3), none(0), ssd(100, 0)}, want: 2},
		{name: "an ineligible holder is never picked",
			cands: []prefixCandidate{hot(8000, 0), hot(10, 0)}, eligible: []bool{false, true}, want: 1},
		{name: "depth counts when tokens are not reported",
			cands: []prefixCandidate{{hit: prefixindex.Hit{Depth: 1, Held: prefixindex.Held{Tier: "hot"}}, slots: 1},
				{hit: prefixindex.Hit{Depth: 3, Held: prefixindex.Held{Tier: "hot"}}, slots: 1}}, want: 1},
		{name: "nothing eligible", cands: []prefixCandidate{hot(1, 0)}, eligible: []bool{false}, want: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.eligible
			if e == nil {
				e = all(len(tc.cands))
			}
			wantChoice(t, tc.cands, e, tc.want)
		})
	}
}

// wantChoice checks that choosePrefix picks want of cands, showing the scores when not.
func wantChoice(t *testing.T, cands []prefixCandidate, eligible []bool, want int) {
	t.Helper()
	if got := choosePrefix(cands, eligible, DefaultLoadBound); got != want {
		scores := make([]float64, len(cands))
		for i, c := range cands {
			scores[i] = prefixScore(c)
		}
		t.Errorf("choosePrefix = %d, want %d (scores %v)", got, want, scores)
	}
}

func TestResolveMode(t *testing.T) {
	tests := []struct {
		routing        string
		set, affinity  bool
		want           Mode
		wantErrContain string
	}{
		{routing: "prefix-cache", want: PrefixCache},
		{routing: "least-load", set: true, want: LeastLoad},
		{routing: "prefix-cache", affinity: true, want: PrefixAffinity},
		{routing: "prefix-affinity", set: true, affinity: true, want: PrefixAffinity},
		{routing: "least-load", set: true, affinity: true, wantErrContain: "--routing=prefix-affinity"},
		{routing: "random", set: true, wantErrContain: "prefix-cache, prefix-affinity, least-load"},
	}
	for _, tc := range tests {
		got, err := ResolveMode(tc.routing, tc.set, tc.affinity)
		if tc.wantErrContain != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErrContain) {
				t.Errorf("ResolveMode(%q, %v, %v) = %v, %v; want an error naming %q", tc.routing, tc.set, tc.affinity, got, err, tc.wantErrContain)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ResolveMode(%q, %v, %v) = %v, %v; want %v", tc.routing, tc.set, tc.affinity, got, err, tc.want)
		}
	}
}

package prefixindex

import (
	"fmt"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
)

func ev(d, tier string, n int) runnerapi.PrefixEvent {
	return runnerapi.PrefixEvent{Digest: d, Tier: tier, Tokens: n}
}

// TestApply: each step's answer applied to one backend, then what the index holds.
func TestApply(t *testing.T) {
	chain := []string{"a", "b", "c", "d"}
	type step struct {
		answer runnerapi.PrefixEvents
		// wantDeepest of chain after the step; wantLen digests held.
		wantDeepest Hit
		wantLen     int
		wantPos     uint64
	}
	tests := []struct {
		name  string
		max   int
		steps []step
	}{
		{name: "first answer, then events after it", steps: []step{
			{answer: runnerapi.PrefixEvents{Epoch: "e1", Seq: 2, Reset: true, Events: []runnerapi.PrefixEvent{ev("a", "hot", 100), ev("b", "ssd", 300)}},
				wantDeepest: Hit{Depth: 2, Held: Held{Tier: "ssd", Tokens: 300}}, wantLen: 2, wantPos: 2},
			{answer: runnerapi.PrefixEvents{Epoch: "e1", Seq: 4, Events: []runnerapi.PrefixEvent{ev("c", "hot", 400), ev("b", "", 0)}},
				wantDeepest: Hit{Depth: 3, Held: Held{Tier: "hot", Tokens: 400}}, wantLen: 2, wantPos: 4},
			{answer: runnerapi.PrefixEvents{Epoch: "e1", Seq: 5, Events: []runnerapi.PrefixEvent{ev("c", "ssd", 400)}},
				wantDeepest: Hit{Depth: 3, Held: Held{Tier: "ssd", Tokens: 400}}, wantLen: 2, wantPos: 5},
		}},
		{name: "a reset replaces the set", steps: []step{
			{answer: runnerapi.PrefixEvents{Epoch: "e1", Seq: 2, Events: []runnerapi.PrefixEvent{ev("a", "hot", 1), ev("d", "hot", 9)}},
				wantDeepest: Hit{Depth: 4, Held: Held{Tier: "hot", Tokens: 9}}, wantLen: 2, wantPos: 2},
			{answer: runnerapi.PrefixEvents{Epoch: "e1", Seq: 90, Reset: true, Events: []runnerapi.PrefixEvent{ev("a", "hot", 1)}},
				wantDeepest: Hit{Depth: 1, Held: Held{Tier: "hot", Tokens: 1}}, wantLen: 1, wantPos: 90},
		}},
		{name: "a new epoch replaces the set even without reset", steps: []step{
			{answer: runnerapi.PrefixEvents{Epoch: "e1", Seq: 7, Events: []runnerapi.PrefixEvent{ev("b", "hot", 5)}},
				wantDeepest: Hit{Depth: 2, Held: Held{Tier: "hot", Tokens: 5}}, wantLen: 1, wantPos: 7},
			{answer: runnerapi.PrefixEvents{Epoch: "e2", Seq: 1, Events: []runnerapi.PrefixEvent{ev("x", "hot", 5)}},
				wantDeepest: Hit{}, wantLen: 1, wantPos: 1},
		}},
		{name: "a full set drops new digests but updates held ones", max: 2, steps: []step{
			{answer: runnerapi.PrefixEvents{Epoch: "e", Seq: 3, Events: []runnerapi.PrefixEvent{ev("a", "hot", 1), ev("b", "hot", 2), ev("c", "hot", 3)}},
				wantDeepest: Hit{Depth: 2, Held: Held{Tier: "hot", Tokens: 2}}, wantLen: 2, wantPos: 3},
			{answer: runnerapi.PrefixEvents{Epoch: "e", Seq: 5, Events: []runnerapi.PrefixEvent{ev("b", "ssd", 2), ev("a", "", 0), ev("d", "hot", 4)}},
				wantDeepest: Hit{Depth: 4, Held: Held{Tier: "hot", Tokens: 4}}, wantLen: 2, wantPos: 5},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, err := New(tc.max, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				x.Apply("ns/r1", s.answer)
				if got := x.Deepest("ns/r1", chain); got != s.wantDeepest {
					t.Errorf("step %d: deepest %+v, want %+v", i, got, s.wantDeepest)
				}
				if got := x.Len("ns/r1"); got != s.wantLen {
					t.Errorf("step %d: %d digests held, want %d", i, got, s.wantLen)
				}
				if epoch, seq := x.Position("ns/r1"); epoch != s.answer.Epoch || seq != s.wantPos {
					t.Errorf("step %d: position %s/%d, want %s/%d", i, epoch, seq, s.answer.Epoch, s.wantPos)
				}
				if got := testutil.ToFloat64(x.m.entries); int(got) != s.wantLen {
					t.Errorf("step %d: entries gauge %v, want %d", i, got, s.wantLen)
				}
			}
			if x.Deepest("ns/other", chain) != (Hit{}) {
				t.Error("another backend holds what r1 holds")
			}
			x.Remove("ns/r1")
			if x.Len("ns/r1") != 0 || x.Deepest("ns/r1", chain) != (Hit{}) || testutil.ToFloat64(x.m.entries) != 0 {
				t.Error("a removed backend still holds digests")
			}
		})
	}
}

func TestDigestKey(t *testing.T) {
	tests := []struct {
		a, b string
		same bool
	}{
		{a: "00000000000000ff", b: "ff", same: true}, // hex digits are their value
		{a: "0123456789abcdef", b: "0123456789abcdee"},
		{a: "x", b: "y"}, // not hex: hashed
		{a: "0123456789abcdef0", b: "123456789abcdef0"}, // 17 digits are hashed, not truncated
		{a: "", b: "0"},
	}
	for _, tc := range tests {
		if got := digestKey(tc.a) == digestKey(tc.b); got != tc.same {
			t.Errorf("digestKey(%q) == digestKey(%q): %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
	if got := digestKey("0123456789abcdef"); got != 0x0123456789abcdef {
		t.Errorf("digestKey of a digest is %#x, want its value", got)
	}
}

func TestApplyKeepsTiersAndTokens(t *testing.T) {
	x, err := New(0, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	evs := []runnerapi.PrefixEvent{ev("a", "hot", 1<<40), ev("b", "peer", 7), ev("c", "ssd", -3)}
	for i := range maxTiers {
		evs = append(evs, ev("d", fmt.Sprintf("tier-%d", i), 1))
	}
	x.Apply("ns/r", runnerapi.PrefixEvents{Epoch: "e", Seq: 1, Events: evs})
	for _, tc := range []struct {
		chain []string
		want  Hit
	}{
		{chain: []string{"a"}, want: Hit{Depth: 1, Held: Held{Tier: "hot", Tokens: math.MaxUint32}}},
		{chain: []string{"b"}, want: Hit{Depth: 1, Held: Held{Tier: "peer", Tokens: 7}}},
		{chain: []string{"c"}, want: Hit{Depth: 1, Held: Held{Tier: "ssd", Tokens: 0}}},
		// d was last reported in a tier beyond maxTiers: it keeps the one before.
		{chain: []string{"d"}, want: Hit{Depth: 1, Held: Held{Tier: fmt.Sprintf("tier-%d", maxTiers-4), Tokens: 1}}},
	} {
		if got := x.Deepest("ns/r", tc.chain); got != tc.want {
			t.Errorf("deepest of %v: %+v, want %+v", tc.chain, got, tc.want)
		}
	}
	if got := testutil.ToFloat64(x.m.dropped); got != 3 {
		t.Errorf("dropped %v, want 3 (the reports of d in the tiers past maxTiers)", got)
	}
}

// TestBytesPerToken: the index keeps the bytes per token a backend's runner last
// reported, across answers that do not carry it (an older runner: 0), and forgets it
// with the backend.
func TestBytesPerToken(t *testing.T) {
	x, err := New(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := x.BytesPerToken("ns/r0"); got != 0 {
		t.Fatalf("unknown backend: %v", got)
	}
	x.Apply("ns/r0", runnerapi.PrefixEvents{Epoch: "e1", Seq: 1, Reset: true, Events: []runnerapi.PrefixEvent{ev("a", "hot", 100)}})
	if got := x.BytesPerToken("ns/r0"); got != 0 {
		t.Errorf("a runner that does not report it: %v, want 0", got)
	}
	x.Apply("ns/r0", runnerapi.PrefixEvents{Epoch: "e1", Seq: 2, Events: []runnerapi.PrefixEvent{ev("b", "hot", 200)}, BytesPerToken: 256})
	x.Apply("ns/r0", runnerapi.PrefixEvents{Epoch: "e1", Seq: 3, Events: []runnerapi.PrefixEvent{ev("c", "hot", 300)}})
	x.Apply("ns/r0", runnerapi.PrefixEvents{Epoch: "e1", Seq: 4, BytesPerToken: math.Inf(1)})
	if got := x.BytesPerToken("ns/r0"); got != 256 {
		t.Errorf("reported 256, then answers without it: %v, want 256", got)
	}
	x.Remove("ns/r0")
	if got := x.BytesPerToken("ns/r0"); got != 0 {
		t.Errorf("after Remove: %v, want 0", got)
	}
}

package peerfetch

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestChooseWarmups: of the states replicas on other Macs hold, a cold replica warms
// the ones the decision says are worth fetching, hit within the maximum age, one per
// digest and partition (from the best source), the most tokens first, then the most
// recent, at most the limit.
func TestChooseWarmups(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	fast := Link{Throughput: 1e9, RTT: time.Millisecond}
	in := func(tokens int) Inputs {
		return Inputs{Tokens: tokens, BytesPerToken: 8192, Link: fast, PrefillRate: 500}
	}
	cand := func(digest, partition, source string, ago time.Duration, inputs Inputs) Candidate {
		return Candidate{Digest: digest, Partition: partition, Source: source, LastHit: now.Add(-ago), TargetServed: now, Inputs: inputs}
	}
	servedAt := func(c Candidate, at time.Time) Candidate {
		c.TargetServed = at
		return c
	}
	name := func(ws []Warmup) []string {
		out := make([]string, 0, len(ws))
		for _, w := range ws {
			out = append(out, fmt.Sprintf("%s/%s@%s", w.Partition, w.Digest, w.Source))
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		cands  []Candidate
		maxAge time.Duration
		limit  int
		want   []string
	}{
		{name: "nothing held: nothing to warm", want: []string{}},
		{name: "the most tokens first, then the most recent",
			cands: []Candidate{
				cand("aa", "team-a", "r1", time.Minute, in(4000)),
				cand("bb", "team-b", "r1", time.Second, in(8000)),
				cand("cc", "team-a", "r1", time.Second, in(4000)),
			},
			want: []string{"team-b/bb@r1", "team-a/cc@r1", "team-a/aa@r1"}},
		{name: "not worth fetching: too few tokens, no prefill rate, a slow link",
			cands: []Candidate{
				cand("aa", "team-a", "r1", 0, in(100)),
				cand("bb", "team-a", "r1", 0, Inputs{Tokens: 8000, BytesPerToken: 8192, Link: fast}),
				cand("cc", "team-a", "r1", 0, Inputs{Tokens: 8000, BytesPerToken: 8192, Link: Link{Throughput: 1e5}, PrefillRate: 500}),
				cand("dd", "team-a", "r1", 0, in(2000)),
			},
			want: []string{"team-a/dd@r1"}},
		{name: "a partition the cold replica's Mac never served, or not within the maximum age: never warmed",
			cands: []Candidate{
				servedAt(cand("aa", "team-b", "r1", 0, in(8000)), time.Time{}),
				servedAt(cand("bb", "team-b", "r1", 0, in(8000)), now.Add(-31*time.Minute)),
				servedAt(cand("cc", "team-a", "r1", 0, in(2000)), now.Add(-29*time.Minute)),
			},
			want: []string{"team-a/cc@r1"}},
		{name: "past the maximum age: forgotten",
			cands: []Candidate{
				cand("aa", "team-a", "r1", 31*time.Minute, in(8000)),
				cand("bb", "team-a", "r1", 29*time.Minute, in(2000)),
			},
			want: []string{"team-a/bb@r1"}},
		{name: "a shorter maximum age",
			cands: []Candidate{
				cand("aa", "team-a", "r1", 2*time.Minute, in(8000)),
				cand("bb", "team-a", "r1", 30*time.Second, in(2000)),
			},
			maxAge: time.Minute,
			want:   []string{"team-a/bb@r1"}},
		{name: "one digest held by two replicas: the faster link's",
			cands: []Candidate{
				cand("aa", "team-a", "r1", 0, Inputs{Tokens: 4000, BytesPerToken: 8192, Link: Link{Throughput: 1e8}, PrefillRate: 500}),
				cand("aa", "team-a", "r2", 0, in(4000)),
			},
			want: []string{"team-a/aa@r2"}},
		{name: "the same digest in two partitions is two states",
			cands: []Candidate{
				cand("aa", "team-a", "r1", 0, in(4000)),
				cand("aa", "team-b", "r1", time.Second, in(4000)),
			},
			want: []string{"team-a/aa@r1", "team-b/aa@r1"}},
		{name: "at most the limit",
			cands: []Candidate{
				cand("aa", "team-a", "r1", 0, in(1000)),
				cand("bb", "team-a", "r1", 0, in(3000)),
				cand("cc", "team-a", "r1", 0, in(2000)),
			},
			limit: 2,
			want:  []string{"team-a/bb@r1", "team-a/cc@r1"}},
		{name: "ties by digest, so the choice is stable",
			cands: []Candidate{
				cand("bb", "team-a", "r1", 0, in(1000)),
				cand("aa", "team-a", "r1", 0, in(1000)),
			},
			want: []string{"team-a/aa@r1", "team-a/bb@r1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ChooseWarmups(tc.cands, now, tc.maxAge, tc.limit)
			if !slices.Equal(name(got), tc.want) {
				t.Fatalf("ChooseWarmups = %v, want %v", name(got), tc.want)
			}
			for _, w := range got {
				if !w.Decision.Fetch || w.Decision.Reason != ReasonFaster {
					t.Errorf("%s chosen with decision %+v", w.Digest, w.Decision)
				}
			}
		})
	}
	many := make([]Candidate, 40)
	for i := range many {
		many[i] = cand(fmt.Sprintf("%02x", i), "team-a", "r1", 0, in(1000+i))
	}
	if got := ChooseWarmups(many, now, 0, 0); len(got) != DefaultWarmLimit || got[0].Digest != "27" {
		t.Fatalf("40 candidates: chose %v, want the %d with the most tokens", name(got), DefaultWarmLimit)
	}
}

// TestRecent: the record keeps a conversation per deepest digest and partition with
// its latest time, at most so many per deployment (the least recent goes) and so many
// deployments (the one routed to least recently goes); and which Macs each chain was
// routed to, when (at most nodesPerChain, the least recent goes).
func TestRecent(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	r := NewRecent(2, 2)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	keys := func(model string) []string {
		var out []string
		for _, c := range r.Chains(model) {
			out = append(out, fmt.Sprintf("%s/%v@%d", c.Partition, c.Digests, int(c.At.Sub(t0).Seconds())))
		}
		slices.Sort(out)
		return out
	}
	r.Record("ns/a", nil, "p", "mac-1", at(0)) // no digests: nothing
	r.Record("ns/a", []string{"1", "2"}, "p", "mac-1", at(1))
	r.Record("ns/a", []string{"1", "2"}, "q", "mac-2", at(2))
	r.Record("ns/a", []string{"1", "2"}, "p", "mac-1", at(3))
	if got, want := keys("ns/a"), []string{"p/[1 2]@3", "q/[1 2]@2"}; !slices.Equal(got, want) {
		t.Fatalf("after the same conversation again: %v, want %v", got, want)
	}
	r.Record("ns/a", []string{"1", "3"}, "p", "mac-1", at(4))
	if got, want := keys("ns/a"), []string{"p/[1 2]@3", "p/[1 3]@4"}; !slices.Equal(got, want) {
		t.Fatalf("past the bound: %v, want %v (the least recent gone)", got, want)
	}
	r.Record("ns/b", []string{"9"}, "p", "mac-1", at(5))
	r.Record("ns/a", []string{"1", "3"}, "p", "mac-1", at(6))
	r.Record("ns/c", []string{"8"}, "p", "mac-1", at(7))
	if got := keys("ns/b"); got != nil {
		t.Fatalf("ns/b (routed to least recently) still recorded: %v", got)
	}
	if len(keys("ns/a")) != 2 || len(keys("ns/c")) != 1 {
		t.Fatalf("ns/a %v, ns/c %v; want both kept", keys("ns/a"), keys("ns/c"))
	}
	sent := func(model, node string) []string {
		var out []string
		for _, c := range r.SentTo(model, node) {
			out = append(out, fmt.Sprintf("%s/%v@%d", c.Partition, c.Digests, int(c.SentAt.Sub(t0).Seconds())))
		}
		slices.Sort(out)
		return out
	}
	r.Record("ns/a", []string{"1", "3"}, "p", "mac-2", at(7)) // the same chain, later to another Mac
	for _, tc := range []struct {
		node string
		want []string
	}{
		{"mac-1", []string{"p/[1 2]@3", "p/[1 3]@6"}},
		{"mac-2", []string{"p/[1 3]@7"}}, // q/[1 2] it was sent made room past the bound
		{"mac-3", nil},
		{"", nil},
	} {
		if got := sent("ns/a", tc.node); !slices.Equal(got, tc.want) {
			t.Errorf("SentTo(ns/a, %q) = %v, want %v", tc.node, got, tc.want)
		}
	}
	r.Record("ns/a", []string{"1", "3"}, "q", "", at(8)) // no Mac: sent to none
	if got := sent("ns/a", ""); got != nil {
		t.Errorf("a request without a Mac counted as sent: %v", got)
	}
	for i := range nodesPerChain + 1 {
		r.Record("ns/a", []string{"1", "3"}, "p", fmt.Sprintf("mac-x%d", i), at(10+i))
	}
	// p/[1 3] was sent to mac-1, mac-2 and 17 more: the three least recent made room.
	for node, want := range map[string][]string{"mac-1": nil, "mac-x0": nil, "mac-x1": {"p/[1 3]@11"}} {
		if got := sent("ns/a", node); !slices.Equal(got, want) {
			t.Errorf("past %d Macs on a chain: SentTo(ns/a, %s) = %v, want %v", nodesPerChain, node, got, want)
		}
	}
	d := []string{"5"}
	r.Record("ns/c", d, "p", "mac-1", at(8))
	d[0] = "changed"
	if got := keys("ns/c"); !slices.Contains(got, "p/[5]@8") {
		t.Fatalf("the record shares the caller's slice: %v", got)
	}
}

// TestWarmLimiter: a replica earns one warm-up per interval whatever epochs it
// reports, and a Mac at most the burst of them per interval.
func TestWarmLimiter(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	type ask struct {
		node, replica string
		at            time.Duration
		want          string // "" allowed, else the reason
	}
	for _, tc := range []struct {
		name string
		asks []ask
	}{
		{name: "a fresh epoch within the interval earns nothing, after it one more", asks: []ask{
			{"mac-1", "r1", 0, ""},
			{"mac-1", "r1", time.Second, RewarmTooSoon},
			{"mac-1", "r1", 9 * time.Minute, RewarmTooSoon},
			{"mac-1", "r1", 10 * time.Minute, ""},
			{"mac-1", "r1", 11 * time.Minute, RewarmTooSoon},
		}},
		{name: "a Mac's replicas: the burst, then none until the first ages out", asks: []ask{
			{"mac-1", "r1", 0, ""},
			{"mac-1", "r2", time.Minute, ""},
			{"mac-2", "r9", time.Minute, ""}, // another Mac's are its own
			{"mac-1", "r3", 2 * time.Minute, RewarmMacBusy},
			{"mac-1", "r3", 10 * time.Minute, ""},
			{"mac-1", "r4", 10 * time.Minute, RewarmMacBusy},
			{"mac-1", "r4", 11 * time.Minute, ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &WarmLimiter{Burst: 2}
			for i, a := range tc.asks {
				ok, why := l.Allow(a.node, a.replica, t0.Add(a.at))
				if ok != (a.want == "") || why != a.want {
					t.Errorf("ask %d (%s %s at +%v) = %v %q, want %q", i, a.node, a.replica, a.at, ok, why, a.want)
				}
			}
		})
	}
}

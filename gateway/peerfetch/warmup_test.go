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
		return Candidate{Digest: digest, Partition: partition, Source: source, LastHit: now.Add(-ago), Inputs: inputs}
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
// deployments (the one routed to least recently goes).
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
	r.Record("ns/a", nil, "p", at(0)) // no digests: nothing
	r.Record("ns/a", []string{"1", "2"}, "p", at(1))
	r.Record("ns/a", []string{"1", "2"}, "q", at(2))
	r.Record("ns/a", []string{"1", "2"}, "p", at(3))
	if got, want := keys("ns/a"), []string{"p/[1 2]@3", "q/[1 2]@2"}; !slices.Equal(got, want) {
		t.Fatalf("after the same conversation again: %v, want %v", got, want)
	}
	r.Record("ns/a", []string{"1", "3"}, "p", at(4))
	if got, want := keys("ns/a"), []string{"p/[1 2]@3", "p/[1 3]@4"}; !slices.Equal(got, want) {
		t.Fatalf("past the bound: %v, want %v (the least recent gone)", got, want)
	}
	r.Record("ns/b", []string{"9"}, "p", at(5))
	r.Record("ns/a", []string{"1", "3"}, "p", at(6))
	r.Record("ns/c", []string{"8"}, "p", at(7))
	if got := keys("ns/b"); got != nil {
		t.Fatalf("ns/b (routed to least recently) still recorded: %v", got)
	}
	if len(keys("ns/a")) != 2 || len(keys("ns/c")) != 1 {
		t.Fatalf("ns/a %v, ns/c %v; want both kept", keys("ns/a"), keys("ns/c"))
	}
	d := []string{"5"}
	r.Record("ns/c", d, "p", at(8))
	d[0] = "changed"
	if got := keys("ns/c"); !slices.Contains(got, "p/[5]@8") {
		t.Fatalf("the record shares the caller's slice: %v", got)
	}
}

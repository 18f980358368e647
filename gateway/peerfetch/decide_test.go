package peerfetch

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
)

func TestDecide(t *testing.T) {
	gigabit := Link{Throughput: 110e6, RTT: 2 * time.Millisecond}
	tenGig := Link{Throughput: 1.1e9, RTT: 2 * time.Millisecond}
	const gib = 1 << 30 // 8192 tokens × 128 KiB
	at := func(rate float64) time.Duration { return time.Duration(gib / rate * float64(time.Second)) }
	for _, tc := range []struct {
		name string
		in   Inputs
		want Decision
	}{
		{name: "8k tokens of an 8B model (1 GiB) over 10 GbE, prefilled at 500 tok/s",
			in:   Inputs{Tokens: 8192, BytesPerToken: 128 << 10, Link: tenGig, PrefillRate: 500},
			want: Decision{Fetch: true, Transfer: 2*time.Millisecond + at(1.1e9), Prefill: 16384 * time.Millisecond, Reason: ReasonFaster}},
		{name: "the same over gigabit: faster, but not twice as fast",
			in:   Inputs{Tokens: 8192, BytesPerToken: 128 << 10, Link: gigabit, PrefillRate: 500},
			want: Decision{Transfer: 2*time.Millisecond + at(110e6), Prefill: 16384 * time.Millisecond, Reason: ReasonSlower}},
		{name: "over an unmeasured link (defaults) a slow prefill is still worth fetching",
			in:   Inputs{Tokens: 8192, BytesPerToken: DefaultBytesPerToken, Link: Link{Throughput: DefaultThroughput, RTT: DefaultRTT}, PrefillRate: 100},
			want: Decision{Fetch: true, Transfer: DefaultRTT + at(DefaultThroughput), Prefill: 81920 * time.Millisecond, Reason: ReasonFaster}},
		{name: "a fast prefill is not worth a slow link",
			in:   Inputs{Tokens: 8192, BytesPerToken: 128 << 10, Link: Link{Throughput: 10e6, RTT: 5 * time.Millisecond}, PrefillRate: 4000},
			want: Decision{Transfer: 5*time.Millisecond + at(10e6), Prefill: 2048 * time.Millisecond, Reason: ReasonSlower}},
		{name: "faster, but not by the margin",
			in:   Inputs{Tokens: 1000, BytesPerToken: 1000, Link: Link{Throughput: 1e6, RTT: 0}, PrefillRate: 600},
			want: Decision{Transfer: time.Second, Prefill: 1666666666, Reason: ReasonSlower}},
		{name: "a margin of 1.5 lets it through",
			in:   Inputs{Tokens: 1000, BytesPerToken: 1000, Link: Link{Throughput: 1e6, RTT: 0}, PrefillRate: 600, Margin: 1.5},
			want: Decision{Fetch: true, Transfer: time.Second, Prefill: 1666666666, Reason: ReasonFaster}},
		{name: "the round trip counts",
			in:   Inputs{Tokens: 1000, BytesPerToken: 1000, Link: Link{Throughput: 1e6, RTT: 200 * time.Millisecond}, PrefillRate: 600, Margin: 1.5},
			want: Decision{Transfer: 1200 * time.Millisecond, Prefill: 1666666666, Reason: ReasonSlower}},
		{name: "no fetch measured yet, the runner reported 256 bytes a token: 4 k tokens over the default link beat a 4 s prefill",
			in:   Inputs{Tokens: 4096, BytesPerToken: 256, Link: Link{Throughput: DefaultThroughput, RTT: DefaultRTT}, PrefillRate: 1024},
			want: Decision{Fetch: true, Transfer: DefaultRTT + 20971520*time.Nanosecond, Prefill: 4 * time.Second, Reason: ReasonFaster}},
		{name: "the same with the default bytes a token (nothing reported): prefilled",
			in:   Inputs{Tokens: 4096, BytesPerToken: DefaultBytesPerToken, Link: Link{Throughput: DefaultThroughput, RTT: DefaultRTT}, PrefillRate: 1024},
			want: Decision{Transfer: DefaultRTT + 10737418240*time.Nanosecond, Prefill: 4 * time.Second, Reason: ReasonSlower}},
		{name: "no prefill measured yet", in: Inputs{Tokens: 8192, BytesPerToken: 1, Link: gigabit},
			want: Decision{Reason: ReasonNoPrefill}},
		{name: "too few tokens", in: Inputs{Tokens: MinTokens - 1, BytesPerToken: 1, Link: gigabit, PrefillRate: 1},
			want: Decision{Reason: ReasonFewTokens}},
		{name: "a broken link estimate", in: Inputs{Tokens: 8192, BytesPerToken: 1, PrefillRate: 100},
			want: Decision{Reason: ReasonNotMeasured}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, Decide(tc.in)); d != "" {
				t.Errorf("Decide(%+v) (-want +got):\n%s", tc.in, d)
			}
		})
	}
}

// TestEstimates: the defaults until measured, then moving averages of the samples:
// a prefill's rate, a fetch's throughput (less the round trip) and bytes per token,
// a quick miss's round trip; per deployment and per link.
func TestEstimates(t *testing.T) {
	e := NewEstimates()
	ab := LinkKey{Source: "mac-1", Target: "mac-2"}
	defaults := Inputs{Tokens: 4096, Margin: 2, BytesPerToken: DefaultBytesPerToken, Link: Link{Throughput: DefaultThroughput, RTT: DefaultRTT}}
	if d := cmp.Diff(defaults, e.Inputs("ns/chat", ab, 4096, 2, Prior{})); d != "" {
		t.Fatalf("before any sample (-want +got):\n%s", d)
	}
	e.ObservePrefill("ns/chat", MinPrefillSample-1, time.Millisecond) // too short to count
	e.ObservePrefill("ns/chat", 1000, 2*time.Second)
	e.ObserveFetch("ns/chat", ab, runnerapi.PeerStateResult{Reason: runnerapi.PeerMissNotFound, Millis: 10}, Link{})
	e.ObserveFetch("ns/chat", ab, runnerapi.PeerStateResult{Imported: true, Tokens: 1000, Bytes: 4e6, Millis: 110}, Link{})
	want := Inputs{Tokens: 4096, Margin: 2, PrefillRate: 500, BytesPerToken: 4000, Link: Link{Throughput: 40e6, RTT: 10 * time.Millisecond}}
	if d := cmp.Diff(want, e.Inputs("ns/chat", ab, 4096, 2, Prior{})); d != "" {
		t.Fatalf("after one sample each (-want +got):\n%s", d)
	}
	e.ObservePrefill("ns/chat", 1000, time.Second)
	e.ObserveFetch("ns/chat", ab, runnerapi.PeerStateResult{Reason: runnerapi.PeerMissUnavailable, Millis: 10000}, Link{}) // a timeout says nothing of the link's RTT
	want.PrefillRate = 0.3*1000 + 0.7*500
	if d := cmp.Diff(want, e.Inputs("ns/chat", ab, 4096, 2, Prior{})); d != "" {
		t.Fatalf("after a second prefill (-want +got):\n%s", d)
	}
	if d := cmp.Diff(defaults, e.Inputs("ns/other", LinkKey{Source: "mac-2", Target: "mac-1"}, 4096, 2, Prior{})); d != "" {
		t.Fatalf("another deployment over the reverse link (-want +got):\n%s", d)
	}
}

// TestEstimatesPrior: before a fetch is measured, the runner's reported bytes per
// token and the Macs' declared link stand in for the defaults; a measured fetch
// replaces them; an unusable prior is the default.
func TestEstimatesPrior(t *testing.T) {
	e := NewEstimates()
	ab := LinkKey{Source: "mac-1", Target: "mac-2"}
	prior := Prior{BytesPerToken: 256, Link: Link{Throughput: 625e6, RTT: time.Millisecond}}
	e.ObservePrefill("ns/chat", 4096, 4*time.Second)
	want := Inputs{Tokens: 4096, Margin: 2, PrefillRate: 1024, BytesPerToken: 256, Link: prior.Link}
	if d := cmp.Diff(want, e.Inputs("ns/chat", ab, 4096, 2, prior)); d != "" {
		t.Fatalf("before any fetch (-want +got):\n%s", d)
	}
	if d := Decide(e.Inputs("ns/chat", ab, 4096, 2, Prior{BytesPerToken: 256})); !d.Fetch {
		t.Errorf("reported 256 bytes a token over the default link: %+v, want a fetch", d)
	}
	if d := Decide(e.Inputs("ns/chat", ab, 4096, 2, Prior{})); d.Fetch {
		t.Errorf("nothing reported (128 KiB a token) over the default link: %+v, want a prefill", d)
	}
	bad := Inputs{Tokens: 4096, Margin: 2, PrefillRate: 1024, BytesPerToken: DefaultBytesPerToken, Link: Link{Throughput: DefaultThroughput, RTT: DefaultRTT}}
	if d := cmp.Diff(bad, e.Inputs("ns/chat", ab, 4096, 2, Prior{BytesPerToken: math.Inf(1), Link: Link{Throughput: -1}})); d != "" {
		t.Errorf("an unusable prior (-want +got):\n%s", d)
	}
	e.ObserveFetch("ns/chat", ab, runnerapi.PeerStateResult{Imported: true, Tokens: 1000, Bytes: 4e5, Millis: 30}, Link{}) // 10 ms over the default round trip
	want.BytesPerToken, want.Link.Throughput = 400, 4e5/0.010
	if d := cmp.Diff(want, e.Inputs("ns/chat", ab, 4096, 2, prior)); d != "" {
		t.Errorf("after a measured fetch (-want +got):\n%s", d)
	}
}

// TestObserveFetchDeclaredRTT: a fetch's throughput is its bytes over its time less
// the link's round trip; before a round trip is measured, the declared one stands in
// for DefaultRTT (a 25 ms fetch over a declared 1 ms link moved its bytes in 24 ms,
// not in the 5 ms the default 20 ms would leave).
func TestObserveFetchDeclaredRTT(t *testing.T) {
	ab := LinkKey{Source: "mac-1", Target: "mac-2"}
	res := runnerapi.PeerStateResult{Imported: true, Tokens: 1000, Bytes: 24e5, Millis: 25}
	for _, tc := range []struct {
		name     string
		declared Link
		want     float64
	}{
		{"declared 1 ms", Link{RTT: time.Millisecond}, 24e5 / 0.024},
		{"nothing declared", Link{}, 24e5 / (0.025 - DefaultRTT.Seconds())},
		{"an unusable declaration", Link{RTT: -time.Second}, 24e5 / (0.025 - DefaultRTT.Seconds())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := NewEstimates()
			e.ObserveFetch("ns/chat", ab, res, tc.declared)
			got := e.Inputs("ns/chat", ab, 4096, 2, Prior{}).Link.Throughput
			if math.Abs(got-tc.want) > 1e-6*tc.want {
				t.Errorf("throughput %.0f B/s, want %.0f", got, tc.want)
			}
		})
	}
}

func TestPairLink(t *testing.T) {
	tb, gb := DeclaredLink(10e9, time.Millisecond), DeclaredLink(1e9, 3*time.Millisecond)
	for _, tc := range []struct {
		name string
		a, b Link
		want Link
	}{
		{"neither declared", Link{}, Link{}, Link{}},
		{"one declared", tb, Link{}, tb},
		{"the slower and the longer round trip", tb, gb, Link{Throughput: 62.5e6, RTT: 3 * time.Millisecond}},
	} {
		if got := PairLink(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: PairLink = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

package routing

import (
	"math"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/prefixindex"
)

func TestPrefixScoreInFlight(t *testing.T) {
	held := func(tier string, depth, tokens int) prefixindex.Hit {
		return prefixindex.Hit{Depth: depth, Held: prefixindex.Held{Tier: tier, Tokens: tokens}}
	}
	for _, tc := range []struct {
		name string
		c    prefixCandidate
		want float64
	}{
		{"nothing held or prefilled", prefixCandidate{slots: 2}, 0},
		{"prefilling only, idle: a slot free, it waits for the prefill and shares it", prefixCandidate{prefilling: 1, slots: 1}, inflightWeight},
		{"prefilling only, one of two slots free: shares it too", prefixCandidate{prefilling: 2, load: 1, slots: 2}, inflightWeight * 2 * 2 / 3},
		{"prefilling only, its only slot taken: it queues behind", prefixCandidate{prefilling: 2, load: 1, slots: 1},
			inflightWeight * 2 * 1 / 3},
		{"prefilling only, both slots taken", prefixCandidate{prefilling: 1, load: 2, slots: 2},
			inflightWeight * 2 / 5},
		{"held with its tokens outweighs the same prefix prefilling", prefixCandidate{hit: held(runnerapi.TierHot, 1, 4000), prefilling: 2, load: 1, slots: 1},
			4000.0 / 3},
		{"held on the SSD, tokens unreported, shallower than the one prefilling",
			prefixCandidate{hit: held(runnerapi.TierSSD, 1, 0), prefilling: 3, load: 1, slots: 1}, math.Max(0.5*1, inflightWeight*3) / 3},
		{"held on the SSD, tokens unreported, as deep as the one prefilling: the SSD's weight",
			prefixCandidate{hit: held(runnerapi.TierSSD, 2, 0), prefilling: 2, load: 1, slots: 1}, 0.5 * 2 / 3},
		{"held shallower, a slot free: the deeper prefill it would share", prefixCandidate{hit: held(runnerapi.TierHot, 1, 0), prefilling: 5, slots: 2}, inflightWeight * 5},
		{"held as deep, a slot free: the held prefix's weight", prefixCandidate{hit: held(runnerapi.TierHot, 5, 0), prefilling: 5, slots: 2}, 5},
		{"prefilled (its requests ended), idle: counts", prefixCandidate{prefilling: 1, prefilled: true, slots: 2}, inflightWeight},
		{"prefilled, one of two slots taken", prefixCandidate{prefilling: 2, prefilled: true, load: 1, slots: 2}, inflightWeight * 2 * 2 / 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := prefixScore(tc.c); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("prefixScore = %v, want %v", got, tc.want)
			}
		})
	}
}

// Replicas of two slots for the choosePrefix tables: holding a prefix hot that spares
// tokens, prefilling one of depth digests, or holding nothing; load requests in flight.
func hot2(tokens, load int) prefixCandidate {
	return prefixCandidate{hit: prefixindex.Hit{Depth: 1, Held: prefixindex.Held{Tier: runnerapi.TierHot, Tokens: tokens}}, load: load, slots: 2}
}

func pre2(depth, load int) prefixCandidate {
	return prefixCandidate{prefilling: depth, load: load, slots: 2}
}

func none2(load int) prefixCandidate { return prefixCandidate{load: load, slots: 2} }

type choiceCase struct {
	name  string
	cands []prefixCandidate
	want  int
}

// wantChoices runs each case with every replica eligible.
func wantChoices(t *testing.T, cases []choiceCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eligible := make([]bool, len(tc.cands))
			for i := range eligible {
				eligible[i] = true
			}
			wantChoice(t, tc.cands, eligible, tc.want)
		})
	}
}

func TestChoosePrefixInFlight(t *testing.T) {
	hot, pre, none := hot2, pre2, none2
	// 9 requests in flight over 4 replicas: the bound is 4 each.
	wantChoices(t, []choiceCase{
		{"nobody holds it, a full replica prefills it: queue there, though busier",
			[]prefixCandidate{none(3), pre(1, 2), none(2), none(2)}, 1},
		{"nobody holds it, the replica prefilling it has a slot free: there, to share it",
			[]prefixCandidate{none(3), pre(1, 1), none(3), none(2)}, 1},
		{"nobody holds it, a replica just prefilled it (the index not told): there, a slot free",
			[]prefixCandidate{none(3), {prefilling: 1, prefilled: true, load: 1, slots: 2}, none(3), none(2)}, 1},
		{"a holder within the bound beats the one prefilling",
			[]prefixCandidate{pre(1, 2), hot(4000, 2), none(3), none(2)}, 1},
		{"the holder over the bound, another prefilling it within the bound: the one prefilling",
			[]prefixCandidate{hot(4000, 4), pre(1, 2), none(2), none(1)}, 1},
		{"the one prefilling over the bound: fall back",
			[]prefixCandidate{pre(1, 5), none(2), none(1), none(1)}, -1},
		{"two prefilling it: the less loaded",
			[]prefixCandidate{pre(1, 3), pre(1, 2), none(2), none(2)}, 1},
		{"prefilling a deeper prefix of the conversation beats a shallower one",
			[]prefixCandidate{pre(1, 2), pre(2, 2), none(3), none(2)}, 1},
	})
}

// TestChoosePrefixFreeSlot: the bench's shape (issue 26's TTFT tail): 4 replicas of 2
// slots, few requests in the fleet, so the load bound (c 1.25) is 1 a replica. A
// replica with a slot free that holds or prefills the request's prefix takes it above
// the bound (a follower shares the first prefill, a tenant's users stay on its
// holder); the bound still spreads the requests that would queue behind full slots.
func TestChoosePrefixFreeSlot(t *testing.T) {
	hot, pre, none := hot2, pre2, none2
	wantChoices(t, []choiceCase{
		{"the fleet's only request prefills the prefix on R (bound 1): its follower goes to R",
			[]prefixCandidate{none(0), pre(1, 1), none(0), none(0)}, 1},
		{"R holds the prefix and serves one request (bound 1): the next user of the tenant goes to R",
			[]prefixCandidate{none(0), hot(4000, 1), none(0), none(0)}, 1},
		{"R prefilling with both slots taken, 2 in the fleet (bound 1): spill, fall back",
			[]prefixCandidate{none(0), pre(1, 2), none(0), none(0)}, -1},
		{"R holding with both slots taken: another holder within the bound takes it",
			[]prefixCandidate{hot(4000, 2), none(0), hot(3000, 0), none(0)}, 2},
		{"a holder with a slot free over the bound, another idle holding as much: the idle one",
			[]prefixCandidate{hot(4000, 1), hot(4000, 0), none(0), none(0)}, 1},
		{"a free slot does not let a replica that holds nothing past the bound",
			[]prefixCandidate{none(1), none(0), none(0), none(0)}, -1},
	})
}

// TestBalancerRoutesToThePrefillingReplica: with nothing in the index, a request's
// prefix is recorded on the replica it went to, the next request of that prefix
// queues there (prefix_inflight) while it has no slot free, goes there once the
// prefill's request ended (the index not told yet), and once the linger passed (fake
// clock) the record no longer routes.
func TestBalancerRoutesToThePrefillingReplica(t *testing.T) {
	index, err := prefixindex.New(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := NewBalancer(DefaultLoadBound, index, true)
	now := time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC)
	b.now = func() time.Time { return now }
	rt := &Route{PromptCache: true, Backends: []Backend{{Key: "ns/r0", Slots: 1}, {Key: "ns/r1", Slots: 1}}}
	hint := func(user string) Hint {
		return Hint{Mode: PrefixCache, Digests: []string{"00000000000000aa", user}}
	}
	first, routed, ok := pick(b, rt, hint("00000000000000b1"))
	if !ok || routed != RoutedFallback {
		t.Fatalf("the first request: routed %q (ok %v), want %q", routed, ok, RoutedFallback)
	}
	now = now.Add(2 * time.Second)
	second, routed, _ := pick(b, rt, hint("00000000000000b2"))
	if routed != RoutedPrefixInFlight || second.Key != first.Key {
		t.Fatalf("the second request of the prefix: %s routed %q, want %s by %q", second.Key, routed, first.Key, RoutedPrefixInFlight)
	}
	// The second ends; the index learns that the first replica holds the prefix: a
	// held hit.
	b.Release(second.Key, 1, hint("00000000000000b2"))
	index.Apply(first.Key, runnerapi.PrefixEvents{Epoch: "e", Reset: true,
		Events: []runnerapi.PrefixEvent{{Digest: "00000000000000aa", Tier: runnerapi.TierHot, Tokens: 4000}}})
	third, routed, _ := pick(b, rt, hint("00000000000000b3"))
	if routed != RoutedPrefixHit || third.Key != first.Key {
		t.Errorf("with the save reported: %s routed %q, want %s by %q", third.Key, routed, first.Key, RoutedPrefixHit)
	}
	index.Remove(first.Key)
	b.Release(third.Key, 1, hint("00000000000000b3"))
	// The first request ends too: its slot is free and holds the prefix, which the
	// index has not heard of (it forgot it here): the next request goes there.
	b.Release(first.Key, 1, hint("00000000000000b1"))
	now = now.Add(prefixindex.DefaultInFlightLinger)
	fourth, routed, _ := pick(b, rt, hint("00000000000000b4"))
	if routed != RoutedPrefixInFlight || fourth.Key != first.Key {
		t.Errorf("just prefilled, within the linger: %s routed %q, want %s by %q", fourth.Key, routed, first.Key, RoutedPrefixInFlight)
	}
	b.Release(fourth.Key, 1, hint("00000000000000b4"))
	now = now.Add(prefixindex.DefaultInFlightLinger + time.Second)
	if _, routed, _ := pick(b, rt, hint("00000000000000b5")); routed != RoutedFallback {
		t.Errorf("past the linger: routed %q, want %q", routed, RoutedFallback)
	}
}

// pick is b.Pick with no exclusions, no limit per slot and one slot: the replica and
// how it was picked.
func pick(b *Balancer, rt *Route, hint Hint) (Backend, string, bool) {
	pk, ok := b.Pick(rt, nil, hint, 0, 1)
	return pk.Backend, pk.Routed, ok
}

package routing

import (
	"fmt"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func backends(n int) []Backend {
	out := make([]Backend, n)
	for i := range out {
		out[i] = Backend{Key: fmt.Sprintf("ns/model-%d", i), Endpoint: fmt.Sprintf("10.0.0.%d:8080", i)}
	}
	return out
}

func allEligible(n int) []bool {
	e := make([]bool, n)
	for i := range e {
		e[i] = true
	}
	return e
}

// TestRingDistribution: with no load, prefixes spread evenly over the replicas (each
// gets its share within 25%), and the same prefix always lands on the same replica.
func TestRingDistribution(t *testing.T) {
	for _, n := range []int{2, 3, 5, 8} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r := newRing(backends(n))
			loads := make([]int, n)
			counts := make([]int, n)
			const keys = 20000
			for k := range keys {
				h := HashKey(fmt.Appendf(nil, "system: you are assistant %d\nuser: hi", k))
				i := chooseBounded(r, loads, allEligible(n), h, DefaultLoadBound)
				counts[i]++
				if again := chooseBounded(r, loads, allEligible(n), h, DefaultLoadBound); again != i {
					t.Fatalf("key %d went to %d, then %d", k, i, again)
				}
			}
			share := float64(keys) / float64(n)
			for i, c := range counts {
				if math.Abs(float64(c)-share) > 0.25*share {
					t.Errorf("replica %d got %d of %d keys, want %.0f ± 25%%", i, c, keys, share)
				}
			}
		})
	}
}

// TestRingStability: removing one replica moves only the keys it owned, and another
// gateway building the ring from the same replicas in another order agrees.
func TestRingStability(t *testing.T) {
	all := backends(5)
	r5 := newRing(all)
	rest := append(append([]Backend{}, all[:2]...), all[3:]...)
	r4 := newRing(rest)
	reversed := append([]Backend{}, all...)
	for i, j := 0, len(reversed)-1; i < j; i, j = i+1, j-1 {
		reversed[i], reversed[j] = reversed[j], reversed[i]
	}
	moved := 0
	for k := range 5000 {
		h := HashKey(fmt.Appendf(nil, "prefix %d", k))
		before := all[chooseBounded(r5, make([]int, 5), allEligible(5), h, DefaultLoadBound)].Key
		after := rest[chooseBounded(r4, make([]int, 4), allEligible(4), h, DefaultLoadBound)].Key
		if other := reversed[chooseBounded(newRingCached(t, reversed), make([]int, 5), allEligible(5), h, DefaultLoadBound)].Key; other != before {
			t.Fatalf("key %d: %s on one gateway, %s on one that listed the replicas in another order", k, before, other)
		}
		if before != after {
			moved++
			if before != all[2].Key {
				t.Fatalf("key %d moved from %s to %s though only %s was removed", k, before, after, all[2].Key)
			}
		}
	}
	if moved == 0 {
		t.Error("no key moved off the removed replica")
	}
}

var ringCache = map[string]ring{}

func newRingCached(t *testing.T, bs []Backend) ring {
	t.Helper()
	k := fmt.Sprint(bs)
	if r, ok := ringCache[k]; ok {
		return r
	}
	r := newRing(bs)
	ringCache[k] = r
	return r
}

// TestBoundedLoad: requests of one hot prefix that never finish pile onto its replica
// only up to ceil(c × average); the overflow walks the ring to the next replicas, and
// at every step no replica exceeds the bound.
func TestBoundedLoad(t *testing.T) {
	for _, c := range []float64{1.0, 1.25, 2} {
		t.Run(fmt.Sprint(c), func(t *testing.T) {
			const n = 4
			r := newRing(backends(n))
			loads := make([]int, n)
			h := HashKey([]byte("the same system prompt"))
			home := chooseBounded(r, loads, allEligible(n), h, c)
			for step := 1; step <= 200; step++ {
				i := chooseBounded(r, loads, allEligible(n), h, c)
				loads[i]++
				bound := int(math.Ceil(c * float64(step) / n))
				for j, l := range loads {
					if l > bound {
						t.Fatalf("step %d: replica %d has %d requests, above ceil(%.2f × %d/%d) = %d (loads %v)",
							step, j, l, c, step, n, bound, loads)
					}
				}
			}
			if loads[home] != int(math.Ceil(c*200/n)) {
				t.Errorf("the prefix's own replica has %d requests, want it full at %d (loads %v)", loads[home],
					int(math.Ceil(c*200/n)), loads)
			}
		})
	}
	// Light load: the prefix stays home.
	r := newRing(backends(3))
	h := HashKey([]byte("p"))
	home := chooseBounded(r, []int{0, 0, 0}, allEligible(3), h, DefaultLoadBound)
	loads := []int{1, 1, 1}
	if got := chooseBounded(r, loads, allEligible(3), h, DefaultLoadBound); got != home {
		t.Errorf("with equal loads the prefix went to %d, not its replica %d", got, home)
	}
	// An excluded home replica (it just failed) gives the next one on the ring.
	ex := allEligible(3)
	ex[home] = false
	if got := chooseBounded(r, []int{0, 0, 0}, ex, h, DefaultLoadBound); got == home || got < 0 {
		t.Errorf("with its replica excluded the prefix went to %d", got)
	}
	if got := chooseBounded(r, []int{0, 0, 0}, []bool{false, false, false}, h, DefaultLoadBound); got != -1 {
		t.Errorf("nothing eligible: got %d, want -1", got)
	}
}

func TestChooseLeast(t *testing.T) {
	tests := []struct {
		loads    []int
		eligible []bool
		start    int
		want     int
	}{
		{[]int{3, 1, 2}, []bool{true, true, true}, 0, 1},
		{[]int{3, 1, 2}, []bool{true, false, true}, 0, 2},
		{[]int{0, 0, 0}, []bool{true, true, true}, 2, 2},
		{[]int{0, 0, 0}, []bool{true, true, true}, 1, 1},
		{[]int{0, 0}, []bool{false, false}, 0, -1},
	}
	for _, tt := range tests {
		if got := chooseLeast(tt.loads, tt.eligible, tt.start); got != tt.want {
			t.Errorf("chooseLeast(%v, %v, %d) = %d, want %d", tt.loads, tt.eligible, tt.start, got, tt.want)
		}
	}
}

// TestBalancerSpreads: concurrent requests (picked and not yet released) spread
// evenly; sequential ones rotate over idle replicas.
func TestBalancerSpreads(t *testing.T) {
	rt := &Route{Backends: backends(3)}
	b := NewBalancer(DefaultLoadBound, nil, true)
	got := map[string]int{}
	for range 9 {
		be, ok := b.pick(rt, nil, false, 0, 0)
		if !ok {
			t.Fatal("no pick")
		}
		got[be.Key]++
	}
	want := map[string]int{"ns/model-0": 3, "ns/model-1": 3, "ns/model-2": 3}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("9 outstanding requests (-want +got):\n%s", d)
	}
	for k, n := range got {
		for range n {
			b.release(k)
		}
		if o := b.Outstanding(k); o != 0 {
			t.Errorf("%s: %d outstanding after release", k, o)
		}
	}
	seq := map[string]int{}
	for range 6 {
		be, _ := b.pick(rt, nil, false, 0, 0)
		seq[be.Key]++
		b.release(be.Key)
	}
	if d := cmp.Diff(map[string]int{"ns/model-0": 2, "ns/model-1": 2, "ns/model-2": 2}, seq); d != "" {
		t.Errorf("6 sequential requests (-want +got):\n%s", d)
	}
	if _, ok := b.pick(rt, map[string]bool{"ns/model-0": true, "ns/model-1": true, "ns/model-2": true}, false, 0, 0); ok {
		t.Error("picked a replica though all were excluded")
	}
	if _, ok := b.pick(&Route{}, nil, true, 1, 0); ok {
		t.Error("picked a replica of a route without any")
	}
}

// TestBalancerRoom: with a limit per slot, a replica takes requests while it has
// room, by its own slots, and then none; releasing one makes room again.
func TestBalancerRoom(t *testing.T) {
	rt := &Route{Backends: []Backend{{Key: "ns/one", Slots: 1}, {Key: "ns/four", Slots: 4}}}
	for _, affinity := range []bool{false, true} {
		b := NewBalancer(DefaultLoadBound, nil, true)
		got := map[string]int{}
		for range 5 {
			be, ok := b.pick(rt, nil, affinity, 7, 1)
			if !ok {
				t.Fatalf("affinity %v: no pick with room left (%v)", affinity, got)
			}
			got[be.Key]++
		}
		if d := cmp.Diff(map[string]int{"ns/one": 1, "ns/four": 4}, got); d != "" {
			t.Errorf("affinity %v: 5 requests on 1+4 slots (-want +got):\n%s", affinity, d)
		}
		if be, ok := b.pick(rt, nil, affinity, 7, 1); ok {
			t.Errorf("affinity %v: picked %s with every slot taken", affinity, be.Key)
		}
		if _, ok := b.pick(rt, nil, affinity, 7, 2); !ok {
			t.Errorf("affinity %v: no pick with 2 per slot", affinity)
		}
		b.release("ns/one")
		b.release("ns/one")
		if be, ok := b.pick(rt, map[string]bool{"ns/four": true}, affinity, 7, 1); !ok || be.Key != "ns/one" {
			t.Errorf("affinity %v: after a release, picked %v %v, want ns/one", affinity, be.Key, ok)
		}
	}
}

// pick is Pick for a request that takes one slot, by affinity on h or least load.
func (b *Balancer) pick(rt *Route, excluded map[string]bool, affinity bool, h uint64, perSlot int) (Backend, bool) {
	hint := Hint{Mode: LeastLoad, H: h}
	if affinity {
		hint.Mode = PrefixAffinity
	}
	pk, ok := b.Pick(rt, excluded, hint, perSlot, 1)
	return pk.Backend, ok
}

// release ends a request counted by pick.
func (b *Balancer) release(key string) { b.Release(key, 1, Hint{}) }

package gateway

import (
	"hash/fnv"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/macfleet/macfleet/gateway/prefixindex"
)

// Balancing defaults.
const (
	// DefaultLoadBound is c in consistent hashing with bounded loads: a replica takes a
	// request for its prefix only while its load stays within c × the average.
	DefaultLoadBound = 1.25
	// DefaultPrefixBytes is how much of a prompt's text (see promptPrefix) decides its
	// replica under prefix affinity.
	DefaultPrefixBytes = 512
	// ringPoints is the number of points each replica has on the hash ring.
	ringPoints = 128
)

// ring is a consistent-hash ring of a route's backends: ringPoints points per backend,
// hashed from the replica's key, so every gateway replica builds the same ring from
// the same replicas.
type ring struct {
	points []uint64
	owner  []int // index into Route.Backends, per point
}

func newRing(backends []Backend) ring {
	type pt struct {
		h uint64
		o int
	}
	pts := make([]pt, 0, len(backends)*ringPoints)
	var buf []byte
	for i, b := range backends {
		for v := range ringPoints {
			buf = append(append(buf[:0], b.Key...), '#', byte(v), byte(v>>8))
			pts = append(pts, pt{hashKey(buf), i})
		}
	}
	slices.SortFunc(pts, func(a, b pt) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return a.o - b.o
	})
	r := ring{points: make([]uint64, len(pts)), owner: make([]int, len(pts))}
	for i, p := range pts {
		r.points[i], r.owner[i] = p.h, p.o
	}
	return r
}

// hashKey is FNV-1a followed by a 64-bit finalizer (splitmix64), so that keys that
// differ in one byte land far apart on the ring. It is stable across processes.
func hashKey(b []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(b)
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// chooseBounded walks the ring clockwise from h and returns the first eligible
// backend whose load after taking the request stays within
// ceil(c × (total load + 1) / eligible backends): consistent hashing with bounded
// loads. Some eligible backend always qualifies (the least loaded one is at most
// average); -1 only when none is eligible.
func chooseBounded(r ring, loads []int, eligible []bool, h uint64, c float64) int {
	n, total := 0, 0
	for i, ok := range eligible {
		if ok {
			n++
			total += loads[i]
		}
	}
	if n == 0 || len(r.points) == 0 {
		return -1
	}
	bound := int(math.Ceil(c * float64(total+1) / float64(n)))
	start, _ := slices.BinarySearch(r.points, h)
	for k := range len(r.points) {
		o := r.owner[(start+k)%len(r.points)]
		if eligible[o] && loads[o]+1 <= bound {
			return o
		}
	}
	return chooseLeast(loads, eligible, 0)
}

// chooseLeast returns the eligible backend with the fewest outstanding requests, ties
// going to the first one found scanning from start (which the caller rotates so that
// idle replicas share sequential requests); -1 when none is eligible.
func chooseLeast(loads []int, eligible []bool, start int) int {
	best := -1
	for k := range len(loads) {
		i := (start + k) % len(loads)
		if eligible[i] && (best < 0 || loads[i] < loads[best]) {
			best = i
		}
	}
	return best
}

// balancer keeps the gateway's own count of outstanding requests per replica and
// picks a replica for each attempt.
type balancer struct {
	c float64
	// index is the fleet's prompt caches for RoutingPrefixCache; nil routes such
	// requests by their fallback.
	index *prefixindex.Index
	// prefilling records which replica each routed prefix is being prefilled on,
	// for RoutingPrefixCache (nil with no index); now is its clock.
	prefilling *prefixindex.InFlight
	now        func() time.Time

	mu       sync.Mutex
	inflight map[string]int
	next     uint
}

func newBalancer(c float64, index *prefixindex.Index) *balancer {
	if c < 1 {
		c = DefaultLoadBound
	}
	b := &balancer{c: c, index: index, now: time.Now, inflight: map[string]int{}}
	if index != nil {
		b.prefilling = prefixindex.NewInFlight(0, 0, 0)
	}
	return b
}

// pick is pickN for a request that takes one slot, by affinity on h or least load.
func (b *balancer) pick(rt *Route, excluded map[string]bool, affinity bool, h uint64, perSlot int) (Backend, bool) {
	hint := routeHint{mode: RoutingLeastLoad, h: h}
	if affinity {
		hint.mode = RoutingPrefixAffinity
	}
	be, _, _, ok := b.pickN(rt, excluded, hint, perSlot, 1)
	return be, ok
}

// pickN chooses a backend of rt that is not excluded and has room for a request that
// takes w slots (a chat with n choices takes n), and counts it there; the caller must
// releaseN the count returned. A backend has room while the gateway's requests on it
// plus w stay within perSlot × its slots (always when perSlot ≤ 0); w is counted as at
// most that, so a request wider than a replica still fits an idle one. The hint's mode
// picks among them (see Routing); routed says how it was picked.
func (b *balancer) pickN(rt *Route, excluded map[string]bool, hint routeHint, perSlot, w int) (be Backend, counted int, routed string, ok bool) {
	n := len(rt.Backends)
	if n == 0 {
		return Backend{}, 0, "", false
	}
	w = max(w, 1)
	width := func(be Backend) int {
		if perSlot <= 0 {
			return w
		}
		return min(w, perSlot*max(be.Slots, 1))
	}
	loads := make([]int, n)
	eligible := make([]bool, n)
	b.mu.Lock()
	defer b.mu.Unlock()
	some := false
	for i, be := range rt.Backends {
		loads[i] = b.inflight[be.Key]
		eligible[i] = !excluded[be.Key] && (perSlot <= 0 || loads[i]+width(be) <= perSlot*max(be.Slots, 1))
		some = some || eligible[i]
	}
	if !some {
		return Backend{}, 0, "", false
	}
	var i int
	switch {
	case hint.mode == RoutingPrefixCache && rt.PromptCache:
		var prefilling bool
		if i, prefilling = b.choosePrefix(rt, loads, eligible, hint.digests); i >= 0 {
			routed = routedPrefixHit
			if prefilling {
				routed = routedPrefixInFlight
			}
		} else if hint.keyed {
			i, routed = chooseBounded(rt.hashRing(), loads, eligible, hint.h, b.c), routedFallback
		} else {
			i, routed = chooseLeast(loads, eligible, int(b.next%uint(n))), routedFallback
			b.next++
		}
	case hint.mode == RoutingPrefixAffinity:
		i, routed = chooseBounded(rt.hashRing(), loads, eligible, hint.h, b.c), routedPrefixAffinity
	default:
		i, routed = chooseLeast(loads, eligible, int(b.next%uint(n))), routedLeastLoad
		b.next++
	}
	be = rt.Backends[i]
	if hint.mode == RoutingPrefixCache && rt.PromptCache {
		b.startPrefill(be.Key, hint.digests)
	}
	counted = width(be)
	b.inflight[be.Key] += counted
	return be, counted, routed, true
}

// choosePrefix reads what each backend of rt holds of digests from the index and
// which of them requests routed there are prefilling, and scores them (see
// choosePrefix); -1 when none holds or prefills any. prefilling: the one chosen holds
// none of them, only prefills them.
func (b *balancer) choosePrefix(rt *Route, loads []int, eligible []bool, digests []string) (i int, prefilling bool) {
	if b.index == nil || len(digests) == 0 {
		return -1, false
	}
	cands := make([]prefixCandidate, len(rt.Backends))
	now := b.now()
	for i, be := range rt.Backends {
		if eligible[i] {
			cands[i] = prefixCandidate{hit: b.index.Deepest(be.Key, digests), load: loads[i], slots: be.Slots}
			if b.prefilling != nil {
				cands[i].prefilling, cands[i].prefilled = b.prefilling.Deepest(be.Key, digests, now)
			}
		}
	}
	if i = choosePrefix(cands, eligible, b.c); i < 0 {
		return -1, false
	}
	return i, cands[i].hit.Depth == 0
}

// withoutInFlight turns the record of prefixes being prefilled off (Options.NoInFlightPrefixes).
func (b *balancer) withoutInFlight() *balancer {
	b.prefilling = nil
	return b
}

// startPrefill records that a request with digests routed to the backend key is
// prefilling them there (prefixindex.InFlight), until endPrefill.
func (b *balancer) startPrefill(key string, digests []string) {
	if b.prefilling != nil && len(digests) > 0 {
		b.prefilling.Start(key, digests, b.now())
	}
}

// endPrefill records that a request with hint routed to the backend key ended (or
// left it), for the prefixes startPrefill recorded.
func (b *balancer) endPrefill(key string, hint routeHint) {
	if b.prefilling != nil && hint.mode == RoutingPrefixCache && len(hint.digests) > 0 {
		b.prefilling.End(key, hint.digests, b.now())
	}
}

// release ends a request counted by pick.
func (b *balancer) release(key string) { b.releaseN(key, 1) }

// releaseN ends a request counted as n by pickN.
func (b *balancer) releaseN(key string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight[key] <= n {
		delete(b.inflight, key)
		return
	}
	b.inflight[key] -= n
}

// outstanding is the gateway's count of requests in flight on a replica.
func (b *balancer) outstanding(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inflight[key]
}

package routing

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
			pts = append(pts, pt{HashKey(buf), i})
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

// HashKey is FNV-1a followed by a 64-bit finalizer (splitmix64), so that keys that
// differ in one byte land far apart on the ring. It is stable across processes.
func HashKey(b []byte) uint64 {
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

// Balancer keeps the gateway's own count of outstanding requests per replica and
// picks a replica for each attempt.
type Balancer struct {
	c float64
	// index is the fleet's prompt caches for PrefixCache; nil routes such requests by
	// their fallback.
	index *prefixindex.Index
	// prefilling records which replica each routed prefix is being prefilled on,
	// for PrefixCache (nil with no index, or without the record); now is its clock.
	prefilling *prefixindex.InFlight
	now        func() time.Time

	mu       sync.Mutex
	inflight map[string]int
	next     uint
}

// NewBalancer is a balancer of bound c (DefaultLoadBound when < 1) that routes
// PrefixCache requests by index (nil: by their fallback), and with inFlight by the
// record of the prefixes being prefilled too.
func NewBalancer(c float64, index *prefixindex.Index, inFlight bool) *Balancer {
	if c < 1 {
		c = DefaultLoadBound
	}
	b := &Balancer{c: c, index: index, now: time.Now, inflight: map[string]int{}}
	if index != nil && inFlight {
		b.prefilling = prefixindex.NewInFlight(0, 0, 0)
	}
	return b
}

// Index is the prefix index the balancer routes by (nil when none).
func (b *Balancer) Index() *prefixindex.Index { return b.index }

// Pick is a replica the balancer picked for a request: the backend, how many of its
// slots it counted there (Release them) and how it was picked (a Routed… label).
type Pick struct {
	Backend Backend
	Counted int
	Routed  string
}

// Pick chooses a backend of rt that is not excluded and has room for a request that
// takes w slots (a chat with n choices takes n), and counts it there; the caller must
// Release the count returned. A backend has room while the gateway's requests on it
// plus w stay within perSlot × its slots (always when perSlot ≤ 0); w is counted as at
// most that, so a request wider than a replica still fits an idle one. The hint's mode
// picks among them (see Mode).
func (b *Balancer) Pick(rt *Route, excluded map[string]bool, hint Hint, perSlot, w int) (Pick, bool) {
	n := len(rt.Backends)
	if n == 0 {
		return Pick{}, false
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
		return Pick{}, false
	}
	i, routed := b.choose(rt, loads, eligible, hint)
	be := rt.Backends[i]
	if hint.Mode == PrefixCache && rt.PromptCache {
		b.startPrefill(be.Key, hint.Digests)
	}
	counted := width(be)
	b.inflight[be.Key] += counted
	return Pick{Backend: be, Counted: counted, Routed: routed}, true
}

// choose is the eligible backend of rt the hint's mode picks, and how it was picked;
// b.mu is held.
func (b *Balancer) choose(rt *Route, loads []int, eligible []bool, hint Hint) (int, string) {
	n := len(rt.Backends)
	switch {
	case hint.Mode == PrefixCache && rt.PromptCache:
		if i, prefilling := b.choosePrefix(rt, loads, eligible, hint.Digests); i >= 0 {
			if prefilling {
				return i, RoutedPrefixInFlight
			}
			return i, RoutedPrefixHit
		}
		if hint.Keyed {
			return chooseBounded(rt.hashRing(), loads, eligible, hint.H, b.c), RoutedFallback
		}
		i := chooseLeast(loads, eligible, int(b.next%uint(n)))
		b.next++
		return i, RoutedFallback
	case hint.Mode == PrefixAffinity:
		return chooseBounded(rt.hashRing(), loads, eligible, hint.H, b.c), RoutedPrefixAffinity
	default:
		i := chooseLeast(loads, eligible, int(b.next%uint(n)))
		b.next++
		return i, RoutedLeastLoad
	}
}

// choosePrefix reads what each backend of rt holds of digests from the index and
// which of them requests routed there are prefilling, and scores them (see
// choosePrefix); -1 when none holds or prefills any. prefilling: the one chosen holds
// none of them, only prefills them.
func (b *Balancer) choosePrefix(rt *Route, loads []int, eligible []bool, digests []string) (i int, prefilling bool) {
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

// startPrefill records that a request with digests routed to the backend key is
// prefilling them there (prefixindex.InFlight), until Release.
func (b *Balancer) startPrefill(key string, digests []string) {
	if b.prefilling != nil && len(digests) > 0 {
		b.prefilling.Start(key, digests, b.now())
	}
}

// Release ends a request with hint counted as n on the backend key by Pick (or that
// left it), and the record of the prefixes it was prefilling there.
func (b *Balancer) Release(key string, n int, hint Hint) {
	b.uncount(key, n)
	if b.prefilling != nil && hint.Mode == PrefixCache && len(hint.Digests) > 0 {
		b.prefilling.End(key, hint.Digests, b.now())
	}
}

// uncount takes n off the backend key's count.
func (b *Balancer) uncount(key string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight[key] <= n {
		delete(b.inflight, key)
		return
	}
	b.inflight[key] -= n
}

// Outstanding is the gateway's count of requests in flight on a replica.
func (b *Balancer) Outstanding(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inflight[key]
}

// Package prefixindex is the gateway's index of the fleet's prompt caches: per
// backend (a model replica), which prefix digests its runner holds and in which tier,
// fed by polling each backend's agent for prefix events (runnerapi.PrefixEvents) and
// read by the balancer to route a conversation to the replica that holds the longest
// part of it. It holds only what the agents report, so a restarted gateway rebuilds it
// from them (the first poll of a backend is a reset).
package prefixindex

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// DefaultMaxPerBackend bounds the digests the index keeps per backend: about 2 MiB
// per backend at the cap. A runner's event log holds far fewer in practice (one
// digest per saved state and turn).
const DefaultMaxPerBackend = 16384

// Held is what a backend holds of a digest.
type Held struct {
	Tier string
	// Tokens is how many prompt tokens its state spares (0: not reported).
	Tokens int
}

// Hit is a backend's deepest held prefix of a request: Depth digests of the request's
// chain (0: none), the deepest in Tier.
type Hit struct {
	Depth int
	Held
}

type backendSet struct {
	epoch   string
	seq     uint64
	digests map[string]Held
}

// Index is safe for concurrent use.
type Index struct {
	maxPer int
	m      *metrics

	mu       sync.RWMutex
	backends map[string]*backendSet
}

// New returns an empty index keeping at most maxPer digests per backend
// (DefaultMaxPerBackend when ≤ 0), its metrics registered with reg (none when nil).
func New(maxPer int, reg prometheus.Registerer) (*Index, error) {
	if maxPer <= 0 {
		maxPer = DefaultMaxPerBackend
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Index{maxPer: maxPer, m: m, backends: map[string]*backendSet{}}, nil
}

// Position is where a backend's events stand: the epoch and seq to ask after.
func (x *Index) Position(backend string) (epoch string, seq uint64) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if b := x.backends[backend]; b != nil {
		return b.epoch, b.seq
	}
	return "", 0
}

// Apply records a poll's answer for backend. A reset, or an answer of another epoch
// than the one known, replaces the backend's set; otherwise the events change it in
// order (an empty tier removes the digest). When the set is full, further stored
// digests are dropped (counted) until evictions make room: the index then routes by
// what it kept, and a dropped digest only costs a fallback.
func (x *Index) Apply(backend string, ev runnerapi.PrefixEvents) {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.backends[backend]
	if b == nil || ev.Reset || ev.Epoch != b.epoch {
		if b != nil {
			x.m.entries.Sub(float64(len(b.digests)))
		}
		b = &backendSet{digests: map[string]Held{}}
		x.backends[backend] = b
		x.m.resets.Inc()
	}
	b.epoch, b.seq = ev.Epoch, ev.Seq
	before := len(b.digests)
	for _, e := range ev.Events {
		switch {
		case e.Tier == "":
			delete(b.digests, e.Digest)
		case len(b.digests) < x.maxPer:
			b.digests[e.Digest] = Held{Tier: e.Tier, Tokens: e.Tokens}
		default:
			if _, ok := b.digests[e.Digest]; ok {
				b.digests[e.Digest] = Held{Tier: e.Tier, Tokens: e.Tokens}
			} else {
				x.m.dropped.Inc()
			}
		}
	}
	x.m.events.Add(float64(len(ev.Events)))
	x.m.entries.Add(float64(len(b.digests) - before))
}

// Remove forgets a backend (it left the table).
func (x *Index) Remove(backend string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if b := x.backends[backend]; b != nil {
		x.m.entries.Sub(float64(len(b.digests)))
		delete(x.backends, backend)
	}
}

// Deepest is the deepest of digests (a request's chain, shallowest first) that
// backend holds.
func (x *Index) Deepest(backend string, digests []string) Hit {
	x.mu.RLock()
	defer x.mu.RUnlock()
	b := x.backends[backend]
	if b == nil {
		return Hit{}
	}
	for i := len(digests) - 1; i >= 0; i-- {
		if h, ok := b.digests[digests[i]]; ok {
			return Hit{Depth: i + 1, Held: h}
		}
	}
	return Hit{}
}

// Len is how many digests the index holds for backend.
func (x *Index) Len(backend string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if b := x.backends[backend]; b != nil {
		return len(b.digests)
	}
	return 0
}

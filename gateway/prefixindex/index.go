// Package prefixindex is the gateway's index of the fleet's prompt caches: per
// backend (a model replica), which prefix digests its runner holds and in which tier,
// fed by polling each backend's agent for prefix events (runnerapi.PrefixEvents) and
// read by the balancer to route a conversation to the replica that holds the longest
// part of it. It holds only what the agents report, so a restarted gateway rebuilds it
// from them (the first poll of a backend is a reset).
package prefixindex

import (
	"math"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// DefaultMaxPerBackend bounds the digests the index keeps per backend: about 0.6 MiB
// per backend at the cap (36 bytes a digest, measured by BenchmarkPrefixIndexFleet). A runner's event log holds far fewer in practice (one
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

// backendSet is what one backend holds. Its digests are kept packed, a digest as
// its 64-bit key (digestKey) and what is held of it as a tier number and its tokens
// (pack): 16 bytes an entry in the map instead of a string key, a tier string and an
// int, which at 100 Macs × 8 replicas × the runner's bound of 16384 digests is the
// difference between about 0.3 and 1.2 GiB (docs/benchmarks.md, issue 26).
type backendSet struct {
	epoch   string
	seq     uint64
	digests map[uint64]uint64
	// bytesPerToken is the latest its runner reported (0: none yet).
	bytesPerToken float64
}

// Index is safe for concurrent use.
type Index struct {
	maxPer int
	m      *metrics

	mu       sync.RWMutex
	backends map[string]*backendSet
	// tiers are the tier names seen, numbered from 1 in the order first seen
	// (tierNums: name to number); a digest's packed value holds the number.
	tiers    []string
	tierNums map[string]uint64
}

// maxTiers bounds the distinct tier names the index numbers; a held digest of a
// further tier is dropped (the wire contract names two).
const maxTiers = 255

// digestKey is digest as a 64-bit key: its value when it is at most 16 hex digits
// (every digest the runners and the gateway make), otherwise its FNV-1a hash. Digests
// are routing hints, so two that share a key cost at worst a miss, never a wrong
// answer.
func digestKey(d string) uint64 {
	if len(d) > 0 && len(d) <= 16 {
		if v, err := strconv.ParseUint(d, 16, 64); err == nil {
			return v
		}
	}
	h := uint64(14695981039346656037)
	for i := 0; i < len(d); i++ {
		h ^= uint64(d[i])
		h *= 1099511628211
	}
	return h
}

// pack is tier number tier and tokens (clamped to 32 bits) as one value.
func pack(tier uint64, tokens int) uint64 {
	return tier<<32 | uint64(min(max(tokens, 0), math.MaxUint32))
}

// tierNum is tier's number, numbering it when it is new; 0 when maxTiers are
// numbered already. Callers hold mu.
func (x *Index) tierNum(tier string) uint64 {
	if n, ok := x.tierNums[tier]; ok {
		return n
	}
	if len(x.tiers) >= maxTiers {
		return 0
	}
	x.tiers = append(x.tiers, tier)
	x.tierNums[tier] = uint64(len(x.tiers))
	return uint64(len(x.tiers))
}

// unpack is a packed value as a Held. Callers hold mu (read).
func (x *Index) unpack(v uint64) Held {
	return Held{Tier: x.tiers[v>>32-1], Tokens: int(v & math.MaxUint32)}
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
	return &Index{maxPer: maxPer, m: m, backends: map[string]*backendSet{}, tierNums: map[string]uint64{}}, nil
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
		b = &backendSet{digests: make(map[uint64]uint64, min(len(ev.Events), x.maxPer))}
		x.backends[backend] = b
		x.m.resets.Inc()
	}
	b.epoch, b.seq = ev.Epoch, ev.Seq
	if ev.BytesPerToken > 0 && !math.IsInf(ev.BytesPerToken, 0) {
		b.bytesPerToken = ev.BytesPerToken
	}
	before := len(b.digests)
	for _, e := range ev.Events {
		k := digestKey(e.Digest)
		if e.Tier == "" {
			delete(b.digests, k)
			continue
		}
		tier := x.tierNum(e.Tier)
		_, held := b.digests[k]
		if tier == 0 || (!held && len(b.digests) >= x.maxPer) {
			x.m.dropped.Inc()
			continue
		}
		b.digests[k] = pack(tier, e.Tokens)
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
		if v, ok := b.digests[digestKey(digests[i])]; ok {
			return Hit{Depth: i + 1, Held: x.unpack(v)}
		}
	}
	return Hit{}
}

// BytesPerToken is the size of backend's saved states per token, as its runner last
// reported it (runnerapi.PrefixEvents.BytesPerToken); 0 when it reported none (an
// older runner, or none saved yet).
func (x *Index) BytesPerToken(backend string) float64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if b := x.backends[backend]; b != nil {
		return b.bytesPerToken
	}
	return 0
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

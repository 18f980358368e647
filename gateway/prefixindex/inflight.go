package prefixindex

import (
	"sync"
	"time"
)

// InFlight is the gateway's record of the prefixes being prefilled: digest D on
// backend B since t, from the gateway routing a request with D to B. The index learns
// that B holds D only when B's runner has saved the state and its agent has reported
// it, which for a prompt of thousands of tokens is seconds later; meanwhile the next
// requests of the same prefix would find no holder and prefill it again elsewhere. The
// balancer scores an in-flight prefix like a held one, with its own weight, so those
// requests go to (and queue for) the replica prefilling it.
//
// An entry lives while requests routed with it are in flight, then Linger more (the
// save's report on its way to the index, which replaces it), and never longer than
// MaxAge since it started (a prefill that long is not worth waiting for, and a lost
// end must not pin routing). At most MaxEntries entries are kept: when full, the dead
// are swept, and a new entry that still does not fit is not recorded (that request's
// followers fall back as they would without the record). Safe for concurrent use.
type InFlight struct {
	maxEntries     int
	maxAge, linger time.Duration

	mu      sync.Mutex
	entries map[inflightKey]*inflightEntry
}

// Defaults of NewInFlight's bounds.
const (
	DefaultInFlightEntries = 65536
	DefaultInFlightMaxAge  = 3 * time.Minute
	DefaultInFlightLinger  = 10 * time.Second
)

type inflightKey struct {
	backend string
	digest  uint64
}

// inflightEntry is one digest being prefilled on one backend: since the first request
// routed with it, requests of them still in flight, and when the last one ended.
type inflightEntry struct {
	since, ended time.Time
	requests     int
}

// inflightLive says whether e still counts at now: started at most maxAge ago, and
// with a request in flight or the last one ended at most linger ago.
func inflightLive(e inflightEntry, now time.Time, maxAge, linger time.Duration) bool {
	if now.Sub(e.since) > maxAge {
		return false
	}
	return e.requests > 0 || now.Sub(e.ended) <= linger
}

// NewInFlight returns an empty record with those bounds (the defaults for values ≤ 0).
func NewInFlight(maxEntries int, maxAge, linger time.Duration) *InFlight {
	if maxEntries <= 0 {
		maxEntries = DefaultInFlightEntries
	}
	if maxAge <= 0 {
		maxAge = DefaultInFlightMaxAge
	}
	if linger <= 0 {
		linger = DefaultInFlightLinger
	}
	return &InFlight{maxEntries: maxEntries, maxAge: maxAge, linger: linger, entries: map[inflightKey]*inflightEntry{}}
}

// Start records that a request with digests (its chain, shallowest first) was routed
// to backend at now. A digest whose entry is dead starts again at now.
func (f *InFlight) Start(backend string, digests []string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range digests {
		k := inflightKey{backend, digestKey(d)}
		e := f.entries[k]
		if e != nil && inflightLive(*e, now, f.maxAge, f.linger) {
			e.requests++
			continue
		}
		if e != nil {
			// Dead: it starts again, still counting the requests in flight that
			// will End it.
			e.since, e.requests = now, e.requests+1
			continue
		}
		if len(f.entries) >= f.maxEntries {
			f.sweepLocked(now)
			if len(f.entries) >= f.maxEntries {
				return
			}
		}
		f.entries[k] = &inflightEntry{since: now, requests: 1}
	}
}

// End records that a request Started with the same backend and digests ended at now.
func (f *InFlight) End(backend string, digests []string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range digests {
		if e := f.entries[inflightKey{backend, digestKey(d)}]; e != nil && e.requests > 0 {
			e.requests--
			if e.requests == 0 {
				e.ended = now
			}
		}
	}
}

// Deepest is how many of digests (a request's chain, shallowest first) are being
// prefilled on backend at now: the depth of the deepest live one (0: none), and
// whether its requests have all ended (done: the prefix was prefilled and is being
// saved and reported, held meanwhile in the slot that prefilled it).
func (f *InFlight) Deepest(backend string, digests []string, now time.Time) (depth int, done bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(digests) - 1; i >= 0; i-- {
		if e := f.entries[inflightKey{backend, digestKey(digests[i])}]; e != nil && inflightLive(*e, now, f.maxAge, f.linger) {
			return i + 1, e.requests == 0
		}
	}
	return 0, false
}

// Len is how many entries the record keeps, dead ones not yet swept included.
func (f *InFlight) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.entries)
}

// sweepLocked drops the dead entries. Callers hold mu.
func (f *InFlight) sweepLocked(now time.Time) {
	for k, e := range f.entries {
		if !inflightLive(*e, now, f.maxAge, f.linger) {
			delete(f.entries, k)
		}
	}
}

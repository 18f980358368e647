package fairqueue

import (
	"math"
	"time"
)

// RateWindow is how far back Rate counts dispatches: long enough to span a few
// generations, short enough to follow a change of replicas.
const RateWindow = 10 * time.Second

// Bounds of RetryAfter.
const (
	MinRetryAfter = time.Second
	MaxRetryAfter = time.Minute
)

// Rate counts a queue's dispatches over the last RateWindow, in one-second buckets, so
// that a client turned away can be told when its turn would likely have come. The zero
// value is ready; the clock is the caller's.
type Rate struct {
	buckets [int(RateWindow / time.Second)]int
	// last is the second (Unix) of the newest bucket.
	last int64
}

// Observe counts one dispatch at now.
func (r *Rate) Observe(now time.Time) {
	r.advance(now)
	r.buckets[r.last%int64(len(r.buckets))]++
}

// PerSecond is the dispatches per second over the window ending at now.
func (r *Rate) PerSecond(now time.Time) float64 {
	r.advance(now)
	sum := 0
	for _, n := range r.buckets {
		sum += n
	}
	return float64(sum) / RateWindow.Seconds()
}

// advance moves the window to now, clearing the buckets of the seconds skipped. A
// clock that steps back counts into the newest bucket.
func (r *Rate) advance(now time.Time) {
	sec := now.Unix()
	if sec <= r.last {
		return
	}
	n := int64(len(r.buckets))
	for s := max(r.last+1, sec-n+1); s <= sec; s++ {
		r.buckets[s%n] = 0
	}
	r.last = sec
}

// RetryAfter is when a request turned away with ahead requests waiting before it
// would likely have been served, at perSecond dispatches per second: (ahead+1) /
// perSecond, rounded up to whole seconds, between MinRetryAfter and MaxRetryAfter.
// Without a measured rate it is fallback (also bounded).
func RetryAfter(ahead int, perSecond float64, fallback time.Duration) time.Duration {
	d := fallback
	if perSecond > 0 {
		secs := math.Ceil(float64(ahead+1) / perSecond)
		d = time.Duration(min(secs, MaxRetryAfter.Seconds())) * time.Second
	}
	return min(max(d, MinRetryAfter), MaxRetryAfter)
}

package peerfetch

import (
	"time"
)

// Re-warming bounds (WarmLimiter).
const (
	// DefaultRewarmInterval: a replica warmed less than this long ago earns no new
	// warm-up from a fresh runner epoch, and a Mac at most DefaultWarmsPerMac of them
	// within it.
	DefaultRewarmInterval = 10 * time.Minute
	// DefaultWarmsPerMac bounds the warm-ups of one Mac's replicas per interval: a
	// scale-up that places a few replicas on one Mac warms each, a Mac that reports a
	// fresh epoch on every poll does not earn a warm-up on every poll.
	DefaultWarmsPerMac = 4
	// maxLimited bounds the Macs and replicas a WarmLimiter remembers; past it the
	// record starts over.
	maxLimited = 4096
)

// Reasons a WarmLimiter refuses a warm-up.
const (
	RewarmTooSoon = "replica_rewarmed"
	RewarmMacBusy = "mac_rate_limited"
)

// WarmLimiter decides whether a replica that reports a cold runner epoch earns a
// warm-up: not when it was warmed within Interval, nor when its Mac had Burst
// warm-ups within Interval. Allow records what it allows. It is not safe for
// concurrent use; the time is the caller's.
type WarmLimiter struct {
	// Interval and Burst: DefaultRewarmInterval and DefaultWarmsPerMac where ≤ 0.
	Interval time.Duration
	Burst    int

	byReplica map[string]time.Time
	byNode    map[string][]time.Time
}

// Allow says whether replica on Mac node may be warmed at now, and if not why
// (RewarmTooSoon, RewarmMacBusy); an allowed warm-up is counted against both.
func (l *WarmLimiter) Allow(node, replica string, now time.Time) (bool, string) {
	interval, burst := l.Interval, l.Burst
	if interval <= 0 {
		interval = DefaultRewarmInterval
	}
	if burst <= 0 {
		burst = DefaultWarmsPerMac
	}
	if l.byReplica == nil || len(l.byReplica) >= maxLimited || len(l.byNode) >= maxLimited {
		l.byReplica, l.byNode = map[string]time.Time{}, map[string][]time.Time{}
	}
	if at, ok := l.byReplica[replica]; ok && now.Sub(at) < interval {
		return false, RewarmTooSoon
	}
	recent := l.byNode[node][:0:0]
	for _, at := range l.byNode[node] {
		if now.Sub(at) < interval {
			recent = append(recent, at)
		}
	}
	l.byNode[node] = recent
	if len(recent) >= burst {
		return false, RewarmMacBusy
	}
	l.byReplica[replica] = now
	l.byNode[node] = append(recent, now)
	return true, ""
}

package httpserver

import (
	"slices"
	"time"
)

// StallGrace is how long a request's headers or body may not arrive before its
// connection counts as stalled: reclaimable at a cap like an idle one. A client that
// sends a request at once is never near it; one that trickles or stalls holds a slot
// for no work.
const StallGrace = time.Second

// MinBodyRate (bytes a second) is the slowest a request body may arrive, on average
// since its handler began, and not count as stalled while its handler waits for it
// (a body trickled a byte at a time).
const MinBodyRate = 4 << 10

// reclaimableSince is since when c (under its listener's lock) holds its slot for no
// work at now, and whether it does: idle (waiting for a request), or stalled (a
// request's headers, or the body its handler waits for, not arriving for StallGrace;
// or that body arriving slower than MinBodyRate once StallGrace passed).
// A connection whose request is being served is never reclaimable.
func reclaimableSince(c *slotConn, now time.Time) (time.Time, bool) {
	switch {
	case !c.idleSince.IsZero():
		return c.idleSince, true
	case !c.handling && !c.activeSince.IsZero() && now.Sub(c.activeSince) >= StallGrace:
		return c.activeSince, true
	case c.handling && !c.waitSince.IsZero() && now.Sub(c.waitSince) >= StallGrace:
		return c.waitSince, true
	case c.handling && !c.waitSince.IsZero() && now.Sub(c.bodyStart) >= StallGrace &&
		float64(c.bodyBytes) < MinBodyRate*now.Sub(c.bodyStart).Seconds():
		return c.bodyStart, true
	}
	return time.Time{}, false
}

// oldestReclaimable is the connection of conns reclaimable for longest at now, nil
// if none is.
func oldestReclaimable(conns map[*slotConn]struct{}, now time.Time) *slotConn {
	var oldest *slotConn
	var since time.Time
	for c := range conns {
		if t, ok := reclaimableSince(c, now); ok && (oldest == nil || t.Before(since)) {
			oldest, since = c, t
		}
	}
	return oldest
}

// victimLocked is the connection a new one takes the slot of at the global cap: the
// oldest reclaimable connection of the source that holds the most connections (the
// one furthest over its share), else of the next, nil if none is reclaimable. l.mu
// is held.
func (l *capListener) victimLocked(now time.Time) *slotConn {
	srcs := make([]string, 0, len(l.sources))
	for s := range l.sources {
		srcs = append(srcs, s)
	}
	slices.SortFunc(srcs, func(a, b string) int { return len(l.sources[b]) - len(l.sources[a]) })
	for _, s := range srcs {
		if v := oldestReclaimable(l.sources[s], now); v != nil {
			return v
		}
	}
	return nil
}

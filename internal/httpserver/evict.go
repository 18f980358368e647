package httpserver

import (
	"slices"
	"time"
)

// MinBodyRate (bytes a second) is the slowest a request body may arrive, on average
// since its handler began, and count as arriving: a body trickled a byte at a time
// counts as stalled since its handler began, not since its last byte.
const MinBodyRate = 4 << 10

// reclaimableSince is since when c (under its listener's lock) holds its slot for no
// work at now, and whether it does: idle (waiting for a request), or waiting for its
// client — a request's headers not ended, or the body its handler reads not there
// (since that read began, or since the handler began when the body comes slower than
// MinBodyRate). A connection whose request is being served is never reclaimable.
// There is no grace: a flood that dials as fast as it is closed would keep every
// slot younger than any grace. The oldest goes first, so a request whose headers or
// body are arriving is the newest and the last to go.
func reclaimableSince(c *slotConn, now time.Time) (time.Time, bool) {
	switch {
	case !c.idleSince.IsZero():
		return c.idleSince, true
	case !c.handling && !c.activeSince.IsZero():
		return c.activeSince, true
	case c.handling && !c.waitSince.IsZero():
		if elapsed := now.Sub(c.bodyStart); float64(c.bodyBytes) < MinBodyRate*elapsed.Seconds() {
			return c.bodyStart, true
		}
		return c.waitSince, true
	}
	return time.Time{}, false
}

// oldestReclaimable is the connection of conns to reclaim at now, nil if none is
// reclaimable, taken in three tiers (reclaimTier), and within a tier the one answered
// the fewest requests, then the one reclaimable for longest:
//
//  1. answered at most once and not fresh: a flood's connections, each answered
//     once (or never) and then held;
//  2. fresh: not yet answered and reclaimable for less than firstRequestGrace. It has
//     had no chance to send its first request, and taking it first would have a
//     flood's new connections close one another before any was answered;
//  3. answered twice or more: a client that reuses its connection (the SDKs do), even
//     when it waited idle for longer than the flood's did (before the flood began),
//     and even beside a flood all of whose connections are fresh (stalled bodies
//     dialled faster than they age, from the client's own address on `serve`).
func oldestReclaimable(conns map[*slotConn]struct{}, now time.Time) *slotConn {
	var oldest *slotConn
	var since time.Time
	tier := 0
	for c := range conns {
		t, ok := reclaimableSince(c, now)
		if !ok {
			continue
		}
		ct := reclaimTier(c, t, now)
		switch {
		case oldest == nil, ct < tier,
			ct == tier && (c.served < oldest.served || c.served == oldest.served && t.Before(since)):
			oldest, since, tier = c, t, ct
		}
	}
	return oldest
}

// reclaimTier is c's tier (oldestReclaimable) at now, reclaimable since t.
func reclaimTier(c *slotConn, t, now time.Time) int {
	switch {
	case c.served >= 2:
		return 3
	case c.served == 0 && now.Sub(t) < firstRequestGrace:
		return 2
	}
	return 1
}

// firstRequestGrace is how long a new connection is left its first request before it
// ranks as any other to reclaim.
const firstRequestGrace = time.Second

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

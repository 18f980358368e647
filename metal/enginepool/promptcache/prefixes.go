package promptcache

import (
	"container/list"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// The prefix table: which of the runner's saved states back each prefix digest the
// gateway sent (runnerapi.HeaderPrefixDigests), and the log of changes the runner
// serves on GET /cache/prefixes. A digest is held in the hot tier when one of its
// backing states is there, in the SSD tier when only an SSD copy remains, and dropped
// when no tier holds any of them. The table learns where states are from a lookup
// (Refresh); it never reads a state.

// Bounds of the prefix table. An entry costs about 250 bytes (the digest, up to
// MaxBackings state keys, the map's share), so a full table takes about 4 MiB; a
// logged event about 64 bytes. They are fixed, not part of the hot tier's budget: the
// table holds keys, never states, and a runner whose hot budget is 0 still reports
// its SSD tier.
const (
	// MaxPrefixDigests bounds the digests the table holds; the least recently saved
	// is dropped first (an event tells the gateways).
	MaxPrefixDigests = 16384
	// MaxBackings bounds the states remembered per digest (the most recent are kept).
	MaxBackings = 4
	// PrefixLogLength bounds the event log; a caller further behind gets a reset.
	PrefixLogLength = 4096
)

// ParseDigests reads a runnerapi.HeaderPrefixDigests value: comma-separated digests
// of 16 lowercase hex digits, shallowest first. It keeps the deepest
// runnerapi.MaxPrefixDigests; a malformed value gives none.
func ParseDigests(h string) []string {
	if h == "" {
		return nil
	}
	out := strings.Split(h, ",")
	for _, d := range out {
		if len(d) != 16 || strings.IndexFunc(d, func(r rune) bool { return (r < '0' || r > '9') && (r < 'a' || r > 'f') }) >= 0 {
			return nil
		}
	}
	if len(out) > runnerapi.MaxPrefixDigests {
		out = out[len(out)-runnerapi.MaxPrefixDigests:]
	}
	return out
}

// Backing is a saved state that backs a digest: the key the state is stored under and
// the prompt tokens a restore of it spares.
type Backing struct {
	State  Key
	Tokens int
}

// DigestHold is where a digest is held: the tier of its best backing state (TierNone:
// nowhere) and the tokens that state spares.
type DigestHold struct {
	Tier   Tier
	Tokens int
}

// HoldOf is where backings are held, by where each state is (TierNone: gone): the hot
// tier when any is hot, else the SSD, else nowhere; among the states of that tier,
// the one that spares the most tokens.
func HoldOf(backings []Backing, where func(Key) Tier) DigestHold {
	var best DigestHold
	for _, b := range backings {
		t := where(b.State)
		switch {
		case t == TierNone:
		case best.Tier == TierNone, t == TierHot && best.Tier == TierSSD:
			best = DigestHold{Tier: t, Tokens: b.Tokens}
		case t == best.Tier:
			best.Tokens = max(best.Tokens, b.Tokens)
		}
	}
	return best
}

// HoldEvent is the event that tells a change of digest's hold from was to now, and
// whether there is one: none when nothing a caller sees changed.
func HoldEvent(digest string, was, now DigestHold) (runnerapi.PrefixEvent, bool) {
	if was == now || (was.Tier == TierNone && now.Tier == TierNone) {
		return runnerapi.PrefixEvent{}, false
	}
	if now.Tier == TierNone {
		return runnerapi.PrefixEvent{Digest: digest}, true
	}
	return runnerapi.PrefixEvent{Digest: digest, Tier: string(now.Tier), Tokens: now.Tokens}, true
}

// AddBacking returns backings with b added (or its tokens updated), most recent last,
// at most MaxBackings of them.
func AddBacking(backings []Backing, b Backing) []Backing {
	out := slices.DeleteFunc(slices.Clone(backings), func(o Backing) bool { return o.State == b.State })
	out = append(out, b)
	if len(out) > MaxBackings {
		out = out[len(out)-MaxBackings:]
	}
	return out
}

// LoggedEvent is an event of the log with its number.
type LoggedEvent struct {
	Seq   uint64
	Event runnerapi.PrefixEvent
}

// AnswerPrefixes is the answer to a caller that knows epoch reqEpoch up to event
// after, from a runner whose table is named epoch, has logged up to seq and keeps
// log (oldest first, consecutive numbers). A caller of another epoch, ahead of seq,
// or behind what the log keeps gets a reset with held, the full listing; otherwise
// the events after its number, one per digest (its latest), in the order of those
// latest events.
func AnswerPrefixes(epoch string, seq uint64, log []LoggedEvent, held []runnerapi.PrefixEvent, reqEpoch string, after uint64) runnerapi.PrefixEvents {
	out := runnerapi.PrefixEvents{Epoch: epoch, Seq: seq, Events: []runnerapi.PrefixEvent{}}
	if NeedsReset(epoch, seq, log, reqEpoch, after) {
		out.Reset = true
		out.Events = append(out.Events, held...)
		return out
	}
	last := map[string]int{} // digest -> index of its latest event in log
	for i, e := range log {
		if e.Seq > after {
			last[e.Event.Digest] = i
		}
	}
	for i, e := range log {
		if e.Seq > after && last[e.Event.Digest] == i {
			out.Events = append(out.Events, e.Event)
		}
	}
	return out
}

// NeedsReset says whether a caller that knows epoch reqEpoch up to event after must
// start over (see AnswerPrefixes).
func NeedsReset(epoch string, seq uint64, log []LoggedEvent, reqEpoch string, after uint64) bool {
	oldest := seq + 1 // the first number the log still holds
	if len(log) > 0 {
		oldest = log[0].Seq
	}
	return reqEpoch != epoch || after > seq || after+1 < oldest
}

// PrefixTable is a runner's table of digests and its event log. It is safe for
// concurrent use.
type PrefixTable struct {
	mu      sync.Mutex
	epoch   string
	digests map[string]*digestEntry
	lru     list.List // of digest strings, front = most recently associated
	seq     uint64
	log     []LoggedEvent
	changed chan struct{} // closed (and replaced) when events are logged
	closed  bool
	// bytesPerToken is the latest saved state's (NoteStateSize), 0 before any.
	bytesPerToken float64
}

type digestEntry struct {
	backings []Backing
	hold     DigestHold // as last reported
	elem     *list.Element
}

// NewPrefixTable returns an empty table named epoch.
func NewPrefixTable(epoch string) *PrefixTable {
	return &PrefixTable{epoch: epoch, digests: map[string]*digestEntry{}, changed: make(chan struct{})}
}

// Epoch names the table.
func (t *PrefixTable) Epoch() string { return t.epoch }

// Associate records that the state b backs each of digests. The hold changes at the
// next Refresh. Beyond MaxPrefixDigests the least recently associated digests are
// dropped (and logged as dropped when they were held).
func (t *PrefixTable) Associate(digests []string, b Backing) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, d := range digests {
		e := t.digests[d]
		if e == nil {
			e = &digestEntry{elem: t.lru.PushFront(d)}
			t.digests[d] = e
		}
		t.lru.MoveToFront(e.elem)
		e.backings = AddBacking(e.backings, b)
	}
	var events []runnerapi.PrefixEvent
	for len(t.digests) > MaxPrefixDigests {
		oldest := t.lru.Remove(t.lru.Back()).(string)
		if ev, ok := HoldEvent(oldest, t.digests[oldest].hold, DigestHold{}); ok {
			events = append(events, ev)
		}
		delete(t.digests, oldest)
	}
	t.logLocked(events)
}

// NoteStateSize records the size of a state the runner saved or imported, bytes for
// tokens, that answers report as the runner's bytes per token
// (runnerapi.PrefixEvents.BytesPerToken).
func (t *PrefixTable) NoteStateSize(bytes int64, tokens int) {
	if bytes <= 0 || tokens <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bytesPerToken = float64(bytes) / float64(tokens)
}

// Backings returns the states that back digest, most tokens first (none when the
// table does not hold it).
func (t *PrefixTable) Backings(digest string) []Backing {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.digests[digest]
	if e == nil {
		return nil
	}
	out := slices.Clone(e.backings)
	slices.SortStableFunc(out, func(a, b Backing) int { return b.Tokens - a.Tokens })
	return out
}

// Refresh recomputes every digest's hold with where (the tier a state is in now),
// forgets the states no tier holds and the digests left without any, and logs the
// changes (in digest order).
func (t *PrefixTable) Refresh(where func(Key) Tier) {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := map[Key]Tier{}
	cached := func(k Key) Tier {
		tier, ok := seen[k]
		if !ok {
			tier = where(k)
			seen[k] = tier
		}
		return tier
	}
	var events []runnerapi.PrefixEvent
	for d, e := range t.digests {
		now := HoldOf(e.backings, cached)
		if ev, ok := HoldEvent(d, e.hold, now); ok {
			events = append(events, ev)
		}
		e.hold = now
		e.backings = slices.DeleteFunc(e.backings, func(b Backing) bool { return cached(b.State) == TierNone })
		if len(e.backings) == 0 {
			t.lru.Remove(e.elem)
			delete(t.digests, d)
		}
	}
	slices.SortFunc(events, func(a, b runnerapi.PrefixEvent) int { return strings.Compare(a.Digest, b.Digest) })
	t.logLocked(events)
}

func (t *PrefixTable) logLocked(events []runnerapi.PrefixEvent) {
	if len(events) == 0 {
		return
	}
	for _, ev := range events {
		t.seq++
		t.log = append(t.log, LoggedEvent{Seq: t.seq, Event: ev})
	}
	if over := len(t.log) - PrefixLogLength; over > 0 {
		t.log = slices.Delete(t.log, 0, over)
	}
	if !t.closed {
		close(t.changed)
		t.changed = make(chan struct{})
	}
}

// Answer is AnswerPrefixes on the table now, and a channel closed at the next logged
// event or at Close (a caller with nothing to answer waits on it).
func (t *PrefixTable) Answer(reqEpoch string, after uint64) (runnerapi.PrefixEvents, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var held []runnerapi.PrefixEvent
	if NeedsReset(t.epoch, t.seq, t.log, reqEpoch, after) {
		for _, d := range slices.Sorted(maps.Keys(t.digests)) {
			if ev, ok := HoldEvent(d, DigestHold{}, t.digests[d].hold); ok {
				held = append(held, ev)
			}
		}
	}
	ans := AnswerPrefixes(t.epoch, t.seq, t.log, held, reqEpoch, after)
	ans.BytesPerToken = t.bytesPerToken
	return ans, t.changed
}

// Close releases every waiter and every later one at once.
func (t *PrefixTable) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed = true
		close(t.changed)
	}
}

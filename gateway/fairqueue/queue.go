// Package fairqueue orders the requests that wait for a model's capacity: a bounded
// queue with two priority classes (interactive before batch, batch never starved) and,
// within a class, round robin over flows (one flow per API key), so one client with a
// thousand requests waiting does not delay another client's one request behind all of
// them. It decides only; it has no goroutines, no clock and no locks (its user holds
// one), so every decision is a pure function of the calls made, table-tested.
package fairqueue

import (
	"fmt"
	"strings"
	"time"
)

// Priority is a request's class. Interactive requests (a person waiting for the
// answer) go before batch requests (jobs that can wait), but not always: see
// Limits.BatchShare.
type Priority uint8

const (
	Interactive Priority = iota
	Batch
	numPriorities
)

// Priorities lists the classes, highest first.
var Priorities = []Priority{Interactive, Batch}

func (p Priority) String() string {
	switch p {
	case Interactive:
		return "interactive"
	case Batch:
		return "batch"
	}
	return fmt.Sprintf("Priority(%d)", uint8(p))
}

// ParsePriority reads "interactive" or "batch" (any case).
func ParsePriority(s string) (Priority, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "interactive":
		return Interactive, nil
	case "batch":
		return Batch, nil
	}
	return 0, fmt.Errorf("unknown priority %q: use interactive or batch", s)
}

// Lower is the lower of two priorities: a key limited to batch stays batch whatever
// its requests ask for.
func Lower(a, b Priority) Priority { return max(a, b) }

// Limits bound a queue.
type Limits struct {
	// MaxQueued is how many requests may wait in all (≥ 1).
	MaxQueued int
	// MaxPerFlow is how many of them one flow may have (≥ 1, at most MaxQueued), so that
	// one client cannot fill the queue and have every other client turned away.
	MaxPerFlow int
	// BatchShare: while both classes wait, one dispatch in BatchShare goes to a batch
	// request (≥ 2; the rest go to interactive ones), so batch is slowed, not starved.
	BatchShare int
	// ReserveSlots is how many of a deployment's slots one client leaves to the others
	// while more than one client is active (see Share); 0 means DefaultReserveSlots, a
	// negative value none.
	ReserveSlots int
	// ActiveWindow is how long a client counts as active after its last request
	// arrived (0: DefaultActiveWindow).
	ActiveWindow time.Duration
}

// Defaults of Limits.
const (
	DefaultMaxQueued  = 256
	DefaultBatchShare = 5
	// DefaultReserveSlots: one slot is enough for a client that sends one request at
	// a time, the case fairness matters most for.
	DefaultReserveSlots = 1
)

// WithDefaults fills in zero fields: MaxQueued DefaultMaxQueued, MaxPerFlow a quarter
// of it, BatchShare DefaultBatchShare, ReserveSlots DefaultReserveSlots (any negative
// value becomes -1), ActiveWindow DefaultActiveWindow.
func (l Limits) WithDefaults() Limits {
	if l.MaxQueued <= 0 {
		l.MaxQueued = DefaultMaxQueued
	}
	if l.MaxPerFlow <= 0 {
		l.MaxPerFlow = max(l.MaxQueued/4, 1)
	}
	l.MaxPerFlow = min(l.MaxPerFlow, l.MaxQueued)
	if l.BatchShare < 2 {
		l.BatchShare = DefaultBatchShare
	}
	switch {
	case l.ReserveSlots == 0:
		l.ReserveSlots = DefaultReserveSlots
	case l.ReserveSlots < 0:
		l.ReserveSlots = -1
	}
	if l.ActiveWindow <= 0 {
		l.ActiveWindow = DefaultActiveWindow
	}
	return l
}

// FullError is a Push the limits refuse.
type FullError struct {
	// PerFlow: the flow has MaxPerFlow requests waiting (the queue may have room for
	// other flows); otherwise the whole queue is full.
	PerFlow bool
	Limit   int
}

func (e *FullError) Error() string {
	if e.PerFlow {
		return fmt.Sprintf("this client already has %d requests waiting, the most one client may have", e.Limit)
	}
	return fmt.Sprintf("%d requests are already waiting, the most the queue holds", e.Limit)
}

// Entry is one waiting request.
type Entry[T any] struct {
	Value    T
	Flow     string
	Priority Priority
	// Since is when it was pushed.
	Since time.Time
	flow  *flow[T]
	gone  bool
}

type flow[T any] struct {
	key   string
	items []*Entry[T]
}

// class is one priority's flows in round-robin order; next is the flow whose turn it is.
type class[T any] struct {
	flows []*flow[T]
	byKey map[string]*flow[T]
	next  int
	n     int
}

// Queue is a fair queue of T. Its zero value is not usable: see New.
type Queue[T any] struct {
	limits  Limits
	classes [numPriorities]class[T]
	perFlow map[string]int
	n       int
	// sinceBatch counts interactive dispatches since the last batch one while batch
	// requests waited.
	sinceBatch int
}

// New is an empty queue with the limits (defaults filled in).
func New[T any](l Limits) *Queue[T] {
	q := &Queue[T]{limits: l.WithDefaults(), perFlow: map[string]int{}}
	for i := range q.classes {
		q.classes[i].byKey = map[string]*flow[T]{}
	}
	return q
}

// Limits are the queue's limits, defaults filled in.
func (q *Queue[T]) Limits() Limits { return q.limits }

// Len is how many requests wait.
func (q *Queue[T]) Len() int { return q.n }

// LenOf is how many requests of a class wait.
func (q *Queue[T]) LenOf(p Priority) int { return q.classes[p].n }

// Push adds v at the end of its flow, or refuses it with a *FullError.
func (q *Queue[T]) Push(flowKey string, p Priority, v T, now time.Time) (*Entry[T], error) {
	if p >= numPriorities {
		return nil, fmt.Errorf("unknown priority %d", p)
	}
	if q.n >= q.limits.MaxQueued {
		return nil, &FullError{Limit: q.limits.MaxQueued}
	}
	if q.perFlow[flowKey] >= q.limits.MaxPerFlow {
		return nil, &FullError{PerFlow: true, Limit: q.limits.MaxPerFlow}
	}
	c := &q.classes[p]
	f := c.byKey[flowKey]
	if f == nil {
		// A new flow joins the round just before the flow whose turn it is, so it is
		// served once every flow already waiting has had its turn.
		f = &flow[T]{key: flowKey}
		c.byKey[flowKey] = f
		c.flows = append(c.flows, nil)
		copy(c.flows[c.next+1:], c.flows[c.next:])
		c.flows[c.next] = f
		c.next++
		if c.next >= len(c.flows) {
			c.next = 0
		}
	}
	e := &Entry[T]{Value: v, Flow: flowKey, Priority: p, Since: now, flow: f}
	f.items = append(f.items, e)
	c.n++
	q.n++
	q.perFlow[flowKey]++
	return e, nil
}

// Remove takes a waiting entry out (its request gave up); false if it was not waiting.
func (q *Queue[T]) Remove(e *Entry[T]) bool {
	if e == nil || e.gone {
		return false
	}
	for i, x := range e.flow.items {
		if x == e {
			q.take(&q.classes[e.Priority], e.flow, i, false)
			return true
		}
	}
	return false
}

// Pop removes and returns the next entry to serve among those for which can returns
// true: can is called on candidates in the queue's order until it returns true, and
// that entry is the one removed (so can may reserve what it found for it). The order:
// the class whose turn it is (interactive, but batch once in BatchShare while both
// wait), then the other; within a class the flows in round robin from the flow whose
// turn it is, each flow in arrival order. False when no entry qualifies.
func (q *Queue[T]) Pop(can func(T) bool) (*Entry[T], bool) {
	order := [2]Priority{Interactive, Batch}
	if q.classes[Batch].n > 0 && (q.classes[Interactive].n == 0 || q.sinceBatch >= q.limits.BatchShare-1) {
		order = [2]Priority{Batch, Interactive}
	}
	for _, p := range order {
		c := &q.classes[p]
		for k := range len(c.flows) {
			fi := (c.next + k) % len(c.flows)
			f := c.flows[fi]
			for i, e := range f.items {
				if can(e.Value) {
					q.take(c, f, i, true)
					q.countDispatch(p)
					return e, true
				}
			}
		}
	}
	return nil, false
}

// countDispatch keeps the batch share.
func (q *Queue[T]) countDispatch(p Priority) {
	switch {
	case p == Batch || q.classes[Batch].n == 0:
		q.sinceBatch = 0
	default:
		q.sinceBatch++
	}
}

// take removes item i of flow f of class c. A dispatch passes the turn to the flow
// after f; a removal leaves the turn where it is.
func (q *Queue[T]) take(c *class[T], f *flow[T], i int, dispatch bool) {
	e := f.items[i]
	e.gone = true
	f.items = append(f.items[:i], f.items[i+1:]...)
	c.n--
	q.n--
	if q.perFlow[f.key]--; q.perFlow[f.key] <= 0 {
		delete(q.perFlow, f.key)
	}
	fi := -1
	for j, x := range c.flows {
		if x == f {
			fi = j
			break
		}
	}
	if len(f.items) == 0 {
		// The flow leaves the round; the flow after it moves to index fi.
		delete(c.byKey, f.key)
		c.flows = append(c.flows[:fi], c.flows[fi+1:]...)
		switch {
		case dispatch:
			c.next = fi // the turn passes to the flow after f
		case fi < c.next:
			c.next-- // the same flow keeps the turn
		}
		if len(c.flows) == 0 {
			c.next = 0
		} else {
			c.next %= len(c.flows)
		}
		return
	}
	if dispatch {
		c.next = (fi + 1) % len(c.flows)
	}
}

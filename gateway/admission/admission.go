// Package admission hands each deployment's free replica capacity to its requests: a
// request goes straight to a replica the balancer (package routing) finds with room,
// or waits in the deployment's fair queue (package fairqueue) until one has room; it
// also names a request's flow and priority in that queue (Classify).
package admission

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
)

// HeaderPriority is the request header that asks for a priority class: interactive
// (the default) or batch. A key's own class (the gateway's KeysFile) caps it.
const HeaderPriority = "X-Macfleet-Priority"

// DefaultMaxInFlightPerSlot is how many requests the gateway sends to a replica at
// once per sequence slot of its engine: one, so a replica generates for every slot and
// what is more waits in the gateway's fair queue rather than in the runner's FIFO.
const DefaultMaxInFlightPerSlot = 1

// Queues hands each deployment's free replica capacity to its requests. A request
// goes straight to a replica when one has room (fewer of this gateway's requests on
// it than Settings.PerSlot × its slots) and nobody waits before it; otherwise it
// waits in the deployment's fair queue (package fairqueue: per-client round robin,
// interactive before batch) until the balancer finds it a replica with room, which
// happens when a request ends, the table changes (a replica comes or goes) or its
// exclusions are cleared. A full queue turns requests away with a 429. While more
// than one client is active, no client may hold every slot of a deployment (package
// fairqueue's Share): one is kept for the others, so a client that arrives while
// another floods the deployment is served at once.
//
// Lock order: Queues.mu, then the balancer's.
type Queues struct {
	perSlot int
	limits  fairqueue.Limits
	// reserve and window configure each deployment's fairqueue.Share.
	reserve int
	window  time.Duration
	// retryAfter is what a 429 asks for when the queue's rate is not known.
	retryAfter time.Duration
	bal        *routing.Balancer
	table      func() *routing.Table
	m          Metrics
	now        func() time.Time

	mu     sync.Mutex
	queues map[string]*modelQueue
}

// modelQueue is one deployment's waiting requests and how fast they leave.
type modelQueue struct {
	q *fairqueue.Queue[*Ticket]
	// area integrates q's length over time (noted at every change), for the
	// agents' load reports (mfv1.HeaderQueuedSeconds).
	area  queueArea
	rate  fairqueue.Rate
	share *fairqueue.Share
	// recheck is armed while a waiting request was held back only by the share: when
	// the other clients go quiet, the slot they were kept is given out again.
	recheck *time.Timer
}

// Metrics are the fair queue's series: its depth and the waits by deployment and
// priority, and the requests it turned away by reason too.
type Metrics struct {
	QueueDepth    *prometheus.GaugeVec
	QueueWait     *prometheus.HistogramVec
	QueueRejected *prometheus.CounterVec
}

// Settings configure Queues: PerSlot is the gateway's requests a replica takes at
// once per sequence slot (≤ 0: no limit, no queue), Limits bound each deployment's
// queue (fairqueue's defaults for zero fields), and RetryAfter is what a 429 asks
// for when the queue's rate is not known yet.
type Settings struct {
	PerSlot    int
	Limits     fairqueue.Limits
	RetryAfter time.Duration
}

// New is the admission of the replicas bal picks among, in the routes of table's
// current snapshot.
func New(s Settings, bal *routing.Balancer, table func() *routing.Table, m Metrics) *Queues {
	limits := s.Limits.WithDefaults()
	return &Queues{perSlot: s.PerSlot, limits: limits, retryAfter: s.RetryAfter,
		reserve: limits.ReserveSlots, window: limits.ActiveWindow,
		bal: bal, table: table, m: m, now: time.Now, queues: map[string]*modelQueue{}}
}

// Request is what admission knows of a request: its deployment's ID, its flow and
// priority in the fair queue (Classify), what picks its replica, and how many
// sequence slots it takes (its n choices, at least 1).
type Request struct {
	Model    string
	Flow     string
	Priority fairqueue.Priority
	Hint     routing.Hint
	Width    int
}

// Ticket is one request's place in admission.
type Ticket struct {
	req Request
	// routed says how the current grant was picked.
	routed string
	// excluded are the replicas that failed this request; the dispatcher reads it
	// while the ticket waits, so it changes under Queues.mu only.
	excluded map[string]bool
	// entry is its place in the queue while it waits, nil otherwise.
	entry *fairqueue.Entry[*Ticket]
	// granted receives the replica found for it while it waited (buffered: the
	// dispatcher never blocks).
	granted chan routing.Backend
	// waited: it has been queued at least once.
	waited bool
	// arrived: the share has seen it arrive.
	arrived bool
	// counted is what the balancer counted for its current grant.
	counted int
}

// NewTicket is r's place in admission, before it asks for a replica.
func (a *Queues) NewTicket(r Request) *Ticket {
	r.Width = max(r.Width, 1)
	return &Ticket{req: r, granted: make(chan routing.Backend, 1)}
}

// Request is what the ticket was made for.
func (t *Ticket) Request() Request { return t.req }

// Routed says how the replica of the current grant was picked (a routing.Routed…
// label).
func (t *Ticket) Routed() string { return t.routed }

// Granted receives the replica found for the ticket while it waited.
func (t *Ticket) Granted() <-chan routing.Backend { return t.granted }

// Excluding reports whether some replica failed the request since its exclusions
// were last cleared (Forgive).
func (t *Ticket) Excluding() bool { return len(t.excluded) > 0 }

// ExcludesAll reports whether every replica of rt failed the request since its
// exclusions were last cleared.
func (t *Ticket) ExcludesAll(rt *routing.Route) bool {
	if len(t.excluded) == 0 {
		return false
	}
	for _, be := range rt.Backends {
		if !t.excluded[be.Key] {
			return false
		}
	}
	return true
}

func (a *Queues) queue(model string) *modelQueue {
	mq := a.queues[model]
	if mq == nil {
		mq = &modelQueue{q: fairqueue.New[*Ticket](a.limits), share: fairqueue.NewShare(a.reserve, a.window)}
		a.queues[model] = mq
	}
	return mq
}

// Acquire returns the replica granted to t while it waited, or one of rt with room
// at once when no request waits before it. Otherwise t waits in the queue (it is
// queued if it was not) and the caller waits for t.Granted; a full queue is the
// *Full returned.
func (a *Queues) Acquire(rt *routing.Route, t *Ticket) (routing.Backend, bool, *Full) {
	a.mu.Lock()
	defer a.mu.Unlock()
	// A replica granted while the request was busy elsewhere (its table changed, its
	// backoff ended) is its own: taking another, or queueing again, would leak the
	// grant's room and let a second grant block the dispatcher.
	select {
	case be := <-t.granted:
		return be, true, nil
	default:
	}
	mq := a.queue(t.req.Model)
	now := a.now()
	if !t.arrived {
		t.arrived = true
		mq.share.Arrive(t.req.Flow, now)
		if mq.share.Len() > maxShareFlows {
			mq.share.Forget(now)
		}
	}
	if t.entry == nil {
		if mq.q.Len() == 0 {
			if be, ok, _ := a.pick(rt, mq, t, now); ok {
				return be, true, nil
			}
		}
		e, err := mq.q.Push(t.req.Flow, t.req.Priority, t, now)
		if err != nil {
			return routing.Backend{}, false, a.rejectFull(rt, mq, t, err, now)
		}
		t.entry, t.waited = e, true
		mq.area.note(mq.q.Len(), now)
		a.m.QueueDepth.WithLabelValues(t.req.Model, t.req.Priority.String()).Inc()
	}
	a.dispatchLocked(rt, mq)
	return routing.Backend{}, false, nil
}

// maxShareFlows is how many clients a deployment's share remembers before it forgets
// the quiet ones.
const maxShareFlows = 64

// pick finds t a replica of rt with room, if its client's share allows it one more
// (heldBack: a replica had room but the share said no), and counts it.
func (a *Queues) pick(rt *routing.Route, mq *modelQueue, t *Ticket, now time.Time) (be routing.Backend, ok, heldBack bool) {
	if a.perSlot > 0 && !mq.share.Allows(t.req.Flow, t.req.Width, capacity(rt, a.perSlot), now) {
		return routing.Backend{}, false, true
	}
	pk, ok := a.bal.Pick(rt, t.excluded, t.req.Hint, a.perSlot, t.req.Width)
	if ok {
		t.counted, t.routed = pk.Counted, pk.Routed
		mq.share.Grant(t.req.Flow, t.counted)
	}
	return pk.Backend, ok, false
}

// capacity is how many requests the gateway sends to rt's replicas at once.
func capacity(rt *routing.Route, perSlot int) int {
	n := 0
	for _, be := range rt.Backends {
		n += perSlot * max(be.Slots, 1)
	}
	return n
}

// dispatchLocked grants rt's room to waiting tickets, in the queue's order, until no
// Waiting ticket can be placed.
func (a *Queues) dispatchLocked(rt *routing.Route, mq *modelQueue) {
	for mq.q.Len() > 0 {
		var be routing.Backend
		now := a.now()
		heldBack := false
		e, ok := mq.q.Pop(func(t *Ticket) bool {
			b, ok, held := a.pick(rt, mq, t, now)
			be, heldBack = b, heldBack || held
			return ok
		})
		if !ok {
			if heldBack {
				a.recheckLater(mq, rt.ID())
			}
			return
		}
		mq.rate.Observe(now)
		mq.area.note(mq.q.Len(), now)
		t := e.Value
		t.entry = nil
		a.dequeued(e, now)
		t.granted <- be
	}
}

// dequeued records that e left the queue.
func (a *Queues) dequeued(e *fairqueue.Entry[*Ticket], now time.Time) {
	model, p := e.Value.req.Model, e.Priority.String()
	a.m.QueueDepth.WithLabelValues(model, p).Dec()
	a.m.QueueWait.WithLabelValues(model, p).Observe(now.Sub(e.Since).Seconds())
}

// recheckLater dispatches the deployment's queue again once the share's window has
// passed, when a client held back by it may hold more (nobody else arrived).
func (a *Queues) recheckLater(mq *modelQueue, model string) {
	if mq.recheck != nil {
		return
	}
	mq.recheck = time.AfterFunc(a.window, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		mq.recheck = nil
		if rt := a.table().Route(model); rt != nil && a.queues[model] == mq {
			a.dispatchLocked(rt, mq)
		}
	})
}

// Release ends t's use of a replica and hands the room to a waiting request.
func (a *Queues) Release(t *Ticket, key string) {
	a.bal.Release(key, t.counted, t.req.Hint)
	a.mu.Lock()
	defer a.mu.Unlock()
	mq := a.queues[t.req.Model]
	if mq == nil {
		return
	}
	mq.share.Done(t.req.Flow, t.counted)
	if mq.q.Len() > 0 {
		if rt := a.table().Route(t.req.Model); rt != nil {
			a.dispatchLocked(rt, mq)
		}
	}
}

// Leave ends t's part in admission when its request stops waiting: out of the queue,
// and a replica granted to it but not used goes to the next one.
func (a *Queues) Leave(t *Ticket) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mq := a.queues[t.req.Model]
	if t.entry != nil {
		if mq.q.Remove(t.entry) {
			now := a.now()
			mq.area.note(mq.q.Len(), now)
			a.dequeued(t.entry, now)
		}
		t.entry = nil
		return
	}
	select {
	case be := <-t.granted:
		a.bal.Release(be.Key, t.counted, t.req.Hint)
		if mq != nil {
			mq.share.Done(t.req.Flow, t.counted)
		}
		if rt := a.table().Route(t.req.Model); rt != nil && mq != nil {
			a.dispatchLocked(rt, mq)
		}
	default:
	}
}

// Exclude keeps t off a replica that failed it (t is not waiting then).
func (a *Queues) Exclude(t *Ticket, key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t.excluded == nil {
		t.excluded = map[string]bool{}
	}
	t.excluded[key] = true
}

// Forgive lets t try every replica again (after a backoff) and places it if one has
// room.
func (a *Queues) Forgive(rt *routing.Route, t *Ticket) {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(t.excluded)
	if mq := a.queues[t.req.Model]; mq != nil {
		a.dispatchLocked(rt, mq)
	}
}

// TableChanged places waiting requests on what the new table offers, and forgets the
// queues of deployments that are gone.
func (a *Queues) TableChanged(t *routing.Table) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, mq := range a.queues {
		rt := t.Route(id)
		switch {
		case rt == nil && mq.q.Len() == 0:
			delete(a.queues, id)
		case rt != nil:
			a.dispatchLocked(rt, mq)
		}
	}
}

// Queued is how many requests wait for model.
// Queued is how many requests wait for model now, and the integral of that over
// time (request-seconds) up to now.
func (a *Queues) Queued(model string) (int, float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if mq := a.queues[model]; mq != nil {
		if n := mq.q.Len(); n > 0 || mq.area.n > 0 { // an empty queue adds nothing
			mq.area.note(n, a.now())
		}
		return mq.q.Len(), mq.area.seconds
	}
	return 0, 0
}

// queueArea is the integral of a queue's length over time: seconds is the sum of
// length × duration up to mark, the last time note was called, when the length was n.
type queueArea struct {
	seconds float64
	n       int
	mark    time.Time
}

// note brings the integral up to now at the length it had since the last note, and
// records n as the length from now on. A clock that went back adds nothing.
func (q *queueArea) note(n int, now time.Time) {
	if now.After(q.mark) {
		if !q.mark.IsZero() {
			q.seconds += float64(q.n) * now.Sub(q.mark).Seconds()
		}
		q.mark = now
	}
	q.n = n
}

// Waiting is how many requests wait for model, and the estimate of how long a new
// one would wait.
func (a *Queues) Waiting(model string) (int, time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mq := a.queues[model]
	if mq == nil {
		return 0, 0
	}
	now := a.now()
	return mq.q.Len(), fairqueue.RetryAfter(mq.q.Len(), mq.rate.PerSecond(now), a.retryAfter)
}

// Full is a request the queue has no room for (a 429): why (Reason, the
// rejections metric's label: queue_full, or queue_full_client when its client has
// its most requests waiting), and the time the requests waiting now would take to
// leave it at the rate they have been leaving.
type Full struct {
	Reason     string
	Message    string
	RetryAfter time.Duration
}

func (f *Full) Error() string { return f.Message }

// rejectFull is the refusal of a request the queue has no room for, counted.
func (a *Queues) rejectFull(rt *routing.Route, mq *modelQueue, t *Ticket, err error, now time.Time) *Full {
	retry := fairqueue.RetryAfter(mq.q.Len(), mq.rate.PerSecond(now), a.retryAfter)
	reason := "queue_full"
	msg := fmt.Sprintf("deployment %s is overloaded: every replica is busy and %v; retry after %d s",
		rt.ID(), err, int(retry.Seconds()))
	if fe, ok := errors.AsType[*fairqueue.FullError](err); ok && fe.PerFlow {
		reason = "queue_full_client"
		msg = fmt.Sprintf("too many requests from this client wait for deployment %s: %v; retry after %d s, "+
			"or send fewer at once", rt.ID(), err, int(retry.Seconds()))
	}
	a.m.QueueRejected.WithLabelValues(t.req.Model, t.req.Priority.String(), reason).Inc()
	return &Full{Reason: reason, Message: msg, RetryAfter: retry}
}

// Classify names the flow in the fair queue of r, sent by id, and its priority:
// its flow is its client — its ServiceAccount, its API key when the gateway takes
// keys (keyed: key is the one it presented), else its address — and its priority
// the HeaderPriority it asks for, no higher than its key's. An error is a
// HeaderPriority that names no class.
func Classify(r *http.Request, id tenancy.Identity, keyed bool, key string) (flow string, p fairqueue.Priority, err error) {
	if v := r.Header.Get(HeaderPriority); v != "" {
		if p, err = fairqueue.ParsePriority(v); err != nil {
			return "", 0, fmt.Errorf("the %s header: %v", HeaderPriority, err)
		}
	}
	if strings.HasPrefix(id.Name, satoken.NamePrefix) {
		// A ServiceAccount's tokens rotate: its flow is the ServiceAccount's.
		return "sa:" + id.Namespace + "/" + id.Name, fairqueue.Lower(p, id.Priority), nil
	}
	if keyed {
		return "key:" + key, fairqueue.Lower(p, id.Priority), nil
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "addr:" + host, p, nil
}

package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/openaierr"
)

// HeaderPriority is the request header that asks for a priority class: interactive
// (the default) or batch. A key's own class (see KeysFile) caps it.
const HeaderPriority = "X-Macfleet-Priority"

// DefaultMaxInFlightPerSlot is how many requests the gateway sends to a replica at
// once per sequence slot of its engine: one, so a replica generates for every slot and
// what is more waits in the gateway's fair queue rather than in the runner's FIFO.
const DefaultMaxInFlightPerSlot = 1

// admission hands each deployment's free replica capacity to its requests. A request
// goes straight to a replica when one has room (fewer of this gateway's requests on
// it than MaxInFlightPerSlot × its slots) and nobody waits before it; otherwise it
// waits in the deployment's fair queue (package fairqueue: per-client round robin,
// interactive before batch) until the balancer finds it a replica with room, which
// happens when a request ends, the table changes (a replica comes or goes) or its
// exclusions are cleared. A full queue turns requests away with a 429. While more
// than one client is active, no client may hold every slot of a deployment (package
// fairqueue's Share): one is kept for the others, so a client that arrives while
// another floods the deployment is served at once.
//
// Lock order: admission.mu, then the balancer's.
type admission struct {
	perSlot int
	limits  fairqueue.Limits
	// reserve and window configure each deployment's fairqueue.Share.
	reserve int
	window  time.Duration
	// routing is the mode of every ticket's hint.
	routing Routing
	bal     *routing.Balancer
	table   func() *Table
	m       *metrics
	now     func() time.Time

	mu     sync.Mutex
	queues map[string]*modelQueue
}

// modelQueue is one deployment's waiting requests and how fast they leave.
type modelQueue struct {
	q *fairqueue.Queue[*ticket]
	// area integrates q's length over time (noted at every change), for the
	// agents' load reports (mfv1.HeaderQueuedSeconds).
	area  queueArea
	rate  fairqueue.Rate
	share *fairqueue.Share
	// recheck is armed while a waiting request was held back only by the share: when
	// the other clients go quiet, the slot they were kept is given out again.
	recheck *time.Timer
}

// ticket is one request's place in admission.
type ticket struct {
	model    string
	flow     string
	priority fairqueue.Priority
	// hint picks its replica; routed says how the current grant was picked.
	hint   routing.Hint
	routed string
	// excluded are the replicas that failed this request; the dispatcher reads it
	// while the ticket waits, so it changes under admission.mu only.
	excluded map[string]bool
	// entry is its place in the queue while it waits, nil otherwise.
	entry *fairqueue.Entry[*ticket]
	// granted receives the replica found for it while it waited (buffered: the
	// dispatcher never blocks).
	granted chan Backend
	// waited: it has been queued at least once.
	waited bool
	// arrived: the share has seen it arrive.
	arrived bool
	// width is how many sequence slots it takes (its n choices); counted is what the
	// balancer counted for its current grant.
	width, counted int
}

func newAdmission(opts Options, bal *routing.Balancer, table func() *Table, m *metrics) *admission {
	limits := opts.Queue.WithDefaults()
	return &admission{perSlot: opts.MaxInFlightPerSlot, limits: limits, routing: opts.Routing,
		reserve: limits.ReserveSlots, window: limits.ActiveWindow,
		bal: bal, table: table, m: m, now: time.Now, queues: map[string]*modelQueue{}}
}

func (a *admission) newTicket(model, flow string, p fairqueue.Priority, h uint64) *ticket {
	return &ticket{model: model, flow: flow, priority: p, hint: routing.Hint{Mode: a.routing, H: h}, width: 1,
		granted: make(chan Backend, 1)}
}

func (a *admission) queue(model string) *modelQueue {
	mq := a.queues[model]
	if mq == nil {
		mq = &modelQueue{q: fairqueue.New[*ticket](a.limits), share: fairqueue.NewShare(a.reserve, a.window)}
		a.queues[model] = mq
	}
	return mq
}

// acquire returns the replica granted to t while it waited, or one of rt with room
// at once when no request waits before it. Otherwise t waits in the queue (it is queued if it was not) and
// the caller waits for t.granted; a full queue is the 429 returned.
func (a *admission) acquire(rt *Route, t *ticket) (Backend, bool, *apiError) {
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
	mq := a.queue(t.model)
	now := a.now()
	if !t.arrived {
		t.arrived = true
		mq.share.Arrive(t.flow, now)
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
		e, err := mq.q.Push(t.flow, t.priority, t, now)
		if err != nil {
			return Backend{}, false, a.rejectFull(rt, mq, t, err, now)
		}
		t.entry, t.waited = e, true
		mq.area.note(mq.q.Len(), now)
		a.m.queueDepth.WithLabelValues(t.model, t.priority.String()).Inc()
	}
	a.dispatchLocked(rt, mq)
	return Backend{}, false, nil
}

// maxShareFlows is how many clients a deployment's share remembers before it forgets
// the quiet ones.
const maxShareFlows = 64

// pick finds t a replica of rt with room, if its client's share allows it one more
// (heldBack: a replica had room but the share said no), and counts it.
func (a *admission) pick(rt *Route, mq *modelQueue, t *ticket, now time.Time) (be Backend, ok, heldBack bool) {
	if a.perSlot > 0 && !mq.share.Allows(t.flow, t.width, capacity(rt, a.perSlot), now) {
		return Backend{}, false, true
	}
	pk, ok := a.bal.Pick(rt, t.excluded, t.hint, a.perSlot, t.width)
	if ok {
		t.counted, t.routed = pk.Counted, pk.Routed
		mq.share.Grant(t.flow, t.counted)
	}
	return pk.Backend, ok, false
}

// capacity is how many requests the gateway sends to rt's replicas at once.
func capacity(rt *Route, perSlot int) int {
	n := 0
	for _, be := range rt.Backends {
		n += perSlot * max(be.Slots, 1)
	}
	return n
}

// dispatchLocked grants rt's room to waiting tickets, in the queue's order, until no
// waiting ticket can be placed.
func (a *admission) dispatchLocked(rt *Route, mq *modelQueue) {
	for mq.q.Len() > 0 {
		var be Backend
		now := a.now()
		heldBack := false
		e, ok := mq.q.Pop(func(t *ticket) bool {
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
func (a *admission) dequeued(e *fairqueue.Entry[*ticket], now time.Time) {
	model, p := e.Value.model, e.Priority.String()
	a.m.queueDepth.WithLabelValues(model, p).Dec()
	a.m.queueWait.WithLabelValues(model, p).Observe(now.Sub(e.Since).Seconds())
}

// recheckLater dispatches the deployment's queue again once the share's window has
// passed, when a client held back by it may hold more (nobody else arrived).
func (a *admission) recheckLater(mq *modelQueue, model string) {
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

// release ends t's use of a replica and hands the room to a waiting request.
func (a *admission) release(t *ticket, key string) {
	a.bal.Release(key, t.counted, t.hint)
	a.mu.Lock()
	defer a.mu.Unlock()
	mq := a.queues[t.model]
	if mq == nil {
		return
	}
	mq.share.Done(t.flow, t.counted)
	if mq.q.Len() > 0 {
		if rt := a.table().Route(t.model); rt != nil {
			a.dispatchLocked(rt, mq)
		}
	}
}

// leave ends t's part in admission when its request stops waiting: out of the queue,
// and a replica granted to it but not used goes to the next one.
func (a *admission) leave(t *ticket) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mq := a.queues[t.model]
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
		a.bal.Release(be.Key, t.counted, t.hint)
		if mq != nil {
			mq.share.Done(t.flow, t.counted)
		}
		if rt := a.table().Route(t.model); rt != nil && mq != nil {
			a.dispatchLocked(rt, mq)
		}
	default:
	}
}

// exclude keeps t off a replica that failed it (t is not waiting then).
func (a *admission) exclude(t *ticket, key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t.excluded == nil {
		t.excluded = map[string]bool{}
	}
	t.excluded[key] = true
}

// forgive lets t try every replica again (after a backoff) and places it if one has
// room.
func (a *admission) forgive(rt *Route, t *ticket) {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(t.excluded)
	if mq := a.queues[t.model]; mq != nil {
		a.dispatchLocked(rt, mq)
	}
}

// tableChanged places waiting requests on what the new table offers, and forgets the
// queues of deployments that are gone.
func (a *admission) tableChanged(t *Table) {
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

// queued is how many requests wait for model.
// queued is how many requests wait for model now, and the integral of that over
// time (request-seconds) up to now.
func (a *admission) queued(model string) (int, float64) {
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

// waiting is how many requests wait for model, and the estimate of how long a new
// one would wait.
func (a *admission) waiting(model string) (int, time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mq := a.queues[model]
	if mq == nil {
		return 0, 0
	}
	now := a.now()
	return mq.q.Len(), fairqueue.RetryAfter(mq.q.Len(), mq.rate.PerSecond(now), coldRetryAfter)
}

// rejectFull is the 429 of a request the queue has no room for, with the time the
// requests waiting now would take to leave it at the rate they have been leaving.
func (a *admission) rejectFull(rt *Route, mq *modelQueue, t *ticket, err error, now time.Time) *apiError {
	retry := fairqueue.RetryAfter(mq.q.Len(), mq.rate.PerSecond(now), coldRetryAfter)
	reason := "queue_full"
	msg := fmt.Sprintf("deployment %s is overloaded: every replica is busy and %v; retry after %d s",
		rt.ID(), err, int(retry.Seconds()))
	if fe, ok := errors.AsType[*fairqueue.FullError](err); ok && fe.PerFlow {
		reason = "queue_full_client"
		msg = fmt.Sprintf("too many requests from this client wait for deployment %s: %v; retry after %d s, "+
			"or send fewer at once", rt.ID(), err, int(retry.Seconds()))
	}
	a.m.queueRejected.WithLabelValues(t.model, t.priority.String(), reason).Inc()
	return &apiError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: codeQueueFull,
		Message: msg, RetryAfter: retry, reason: reason}
}

// classify names the request's flow in the fair queue, its client (its API key when
// the gateway has keys, else its address), and its priority: the HeaderPriority it
// asks for, no higher than its key's.
func (g *Gateway) classify(r *http.Request, id tenancy.Identity) (flow string, p fairqueue.Priority, aerr *apiError) {
	if v := r.Header.Get(HeaderPriority); v != "" {
		var err error
		if p, err = fairqueue.ParsePriority(v); err != nil {
			return "", 0, invalidRequest(openaierr.CodeInvalidValue, "", "bad_request", "the %s header: %v", HeaderPriority, err)
		}
	}
	if strings.HasPrefix(id.Name, satoken.NamePrefix) {
		// A ServiceAccount's tokens rotate: its flow is the ServiceAccount's.
		return "sa:" + id.Namespace + "/" + id.Name, fairqueue.Lower(p, id.Priority), nil
	}
	if g.opts.Identify != nil {
		return "key:" + clientKey(r), fairqueue.Lower(p, id.Priority), nil
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "addr:" + host, p, nil
}

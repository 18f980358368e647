package gateway

import (
	"context"
	"net/http"
	"time"

	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/internal/openaierr"
)

// waiting is what serve knows of one request's waits for a replica.
type waiting struct {
	g     *Gateway
	model string
	start time.Time
	// hd is the current wait's span (tracing only).
	hd *hold
	// The deadline timer is made only once the request waits: most requests never do.
	deadline *time.Timer
	// waitable: some failure since the last reset may go away by waiting.
	waitable  bool
	last      *failure
	heldSince time.Time
	backoff   time.Duration
	// unhold ends this request's part in waking the deployment (see waker); woke: it
	// asked once for a replica more because every replica was busy.
	unhold func()
	woke   bool
}

// waitNext is what serve does after a wait.
type waitNext int

const (
	// waitGranted: a replica was granted; attempt it.
	waitGranted waitNext = iota
	// waitAgain: the table changed or the backoff passed; resolve the route again.
	waitAgain
	// waitDone: the request was answered (or its client went away).
	waitDone
)

// end releases what the waits hold once the request is done with reason.
func (wt *waiting) end(reason string) {
	if wt.unhold != nil {
		wt.unhold()
	}
	stopTimer(wt.deadline)
	wt.hd.end(reason)
}

// observe records how long the request was held without a routable replica.
func (wt *waiting) observe() {
	if !wt.heldSince.IsZero() {
		wt.g.metrics.held.WithLabelValues(wt.model).Observe(time.Since(wt.heldSince).Seconds())
	}
}

// granted ends the current wait: a replica was granted.
func (wt *waiting) granted() {
	if wt.unhold != nil {
		wt.unhold()
		wt.unhold = nil
	}
	wt.hd.end("granted")
	wt.hd = nil
}

// wait waits for route rt of table tbl to grant t a replica: it wakes the deployment
// if it is wakeable, answers a request whose every replica failed, and else waits
// for a grant, the table to change, the backoff, the client or the deadline.
func (wt *waiting) wait(ctx context.Context, w http.ResponseWriter, tbl *Table, rt *Route, t *admission.Ticket, wakeable bool) (Backend, outcome, waitNext) {
	g := wt.g
	if res, done := wt.wake(ctx, w, rt, wakeable); done {
		return Backend{}, res, waitDone
	}
	if wt.last != nil && !wt.waitable && t.ExcludesAll(rt) {
		wt.last.writeThrough(w)
		wt.observe()
		return Backend{}, outcome{status: wt.last.status, reason: "upstream_unavailable"}, waitDone
	}
	if wt.heldSince.IsZero() && len(rt.Backends) == 0 {
		wt.heldSince = time.Now()
	}
	if wt.deadline == nil {
		wt.deadline = time.NewTimer(time.Until(wt.start.Add(g.opts.ColdStartTimeout)))
	}
	if wt.hd == nil {
		wt.hd = g.startHold(ctx, rt, t)
	}
	var retry <-chan time.Time
	var bt *time.Timer
	if t.Excluding() {
		bt = time.NewTimer(wt.backoff)
		retry = bt.C
	}
	select {
	case be := <-t.Granted():
		stopTimer(bt)
		return be, outcome{}, waitGranted
	case <-ctx.Done():
		stopTimer(bt)
		wt.observe()
		return Backend{}, outcome{status: openaierr.StatusClientGone, reason: "client_gone"}, waitDone
	case <-wt.deadline.C:
		stopTimer(bt)
		wt.observe()
		e := g.holdTimeout(rt, wt.last, t)
		e.write(w)
		return Backend{}, outcome{status: e.Status, reason: e.reason}, waitDone
	case <-tbl.Changed():
		stopTimer(bt)
		return Backend{}, outcome{}, waitAgain
	case <-retry:
		g.adm.Forgive(rt, t)
		wt.waitable = false
		wt.backoff = min(2*wt.backoff, maxBackoff)
		return Backend{}, outcome{}, waitAgain
	}
}

// wake asks the autoscaler for a replica: for a wakeable deployment (no routable
// replica) once, answering the request if that fails; for one whose every replica is
// busy once, logging and counting a failed write, the request keeping its place.
func (wt *waiting) wake(ctx context.Context, w http.ResponseWriter, rt *Route, wakeable bool) (outcome, bool) {
	g := wt.g
	switch {
	case wakeable && wt.unhold == nil:
		rel, err := g.waker.Hold(ctx, rt)
		if err != nil {
			wt.observe()
			if ctx.Err() != nil {
				return outcome{status: openaierr.StatusClientGone, reason: "client_gone"}, true
			}
			e := wakeError(err)
			e.write(w)
			return outcome{status: e.Status, reason: e.reason}, true
		}
		wt.unhold = rel
	case wt.unhold == nil && !wt.woke && len(rt.Backends) > 0 && rt.Autoscaled && g.waker != nil && rt.Replicas < rt.MaxReplicas:
		// Every replica is busy: the queue asks the autoscaler for one more, as
		// a held request does. A failed write is logged and counted; the request
		// keeps its place.
		wt.woke = true
		if rel, err := g.waker.Hold(ctx, rt); err == nil {
			wt.unhold = rel
		}
	}
	return outcome{}, false
}

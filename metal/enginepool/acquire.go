package enginepool

import (
	"context"
	"time"

	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// One request's way through the pool, all in this file:
//
//	Acquire        a lease on a Ready engine, loading the model first if it must
//	  state.route  under the lock: decide.RouteRequest, then a lease, a join or a new load
//	  startLoad    a new load goes to its owner goroutine (loader.start, load.go)
//	  await        wait for the load, bounded by the request's context
//
// The request then holds its Lease (lease.go: Runner, Release), and the agent checks
// the prompt against memory with CheckPrefill (prefill.go) before the first byte.
//
// Lock discipline (ENGINE_POOL.md): the state's mutex is held to decide and to apply a
// decision, never across a runner start, a wait, a measurement or an eviction; loads
// are admitted one at a time (loader.admitting), and serving a loaded model never
// waits behind them.

// maxAcquireRounds bounds how often Acquire follows a load that ended in a state it
// cannot lease from (for example a load immediately evicted again).
const maxAcquireRounds = 4

// Acquire returns a lease on model (a name or alias). If the model is not loaded it
// triggers the load — for any residency — and waits for it, bounded by ctx; the load
// itself goes on for other callers if ctx ends. Errors are StatusErrors: 404 unknown
// model; 503 + Retry-After while draining, stopping, in failure backoff or still
// loading when ctx ends; 507 when admission cannot make room.
func (p *Pool) Acquire(ctx context.Context, model string) (*Lease, error) {
	cold := false
	for range maxAcquireRounds {
		r := p.st.route(model)
		if r.lease != nil {
			r.lease.cold = cold
			if r.first {
				signal(p.wake.active) // the engine was idle: poll within PollActive
			}
			return r.lease, nil
		}
		if r.err != nil {
			return nil, r.err
		}
		if r.load != nil {
			p.loader.start(*r.load)
		}
		cold = true
		if err := await(ctx, model, r.attempt, p.cfg.RetryAfter); err != nil {
			return nil, err
		}
	}
	return nil, &UnavailableError{Model: model, State: StateLoading, ErrCode: CodeModelLoading,
		Reason: "the model was unloaded again right after loading", Retry: p.cfg.RetryAfter}
}

// Load loads model if it is not loaded and waits for it, bounded by ctx (admin load,
// eager loading of Resident and Pinned models).
func (p *Pool) Load(ctx context.Context, model string) error {
	l, err := p.Acquire(ctx, model)
	if err != nil {
		return err
	}
	l.Release()
	return nil
}

// routed is a request's route: a lease (first: the engine's only one), or the load
// attempt to wait for (with the load to hand to its owner when the route began it),
// or the refusal.
type routed struct {
	lease   *Lease
	first   bool
	attempt *loadAttempt
	load    *loadJob
	err     error
}

// route decides, under the lock, what a request for model does (decide.RouteRequest)
// and applies it: a lease on a Ready engine (it restarts the entry's idle clock), the
// load under way to join, a new load, or the refusal.
func (s *state) route(model string) routed {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	e := s.lookup(model)
	in := decide.RouteInput{Now: now, Closed: s.closed, Known: e != nil && !e.removed}
	if in.Known {
		in.Retired, in.State, in.RetryAt = e.retired, e.state, e.retryAt
	}
	d := decide.RouteRequest(in)
	switch d.Kind {
	case decide.RouteLease:
		g := e.eng
		g.inUse++
		g.requests++
		offset := int64(now.Sub(g.loadedAt))
		g.activeNanos += offset
		s.activity++
		e.lastUsed = now
		return routed{lease: &Lease{st: s, eng: g, model: e.spec.Name, offset: offset}, first: g.inUse == 1}
	case decide.RouteJoin:
		return routed{attempt: e.attempt}
	case decide.RouteLoad:
		job := s.beginLoad(e)
		return routed{attempt: job.attempt, load: &job}
	}
	return routed{err: refusal(model, e, d, s.cfg.RetryAfter)}
}

// beginLoad moves e to Loading with a new attempt, whose owner goroutine the
// returned job starts: it drives e to Ready, Failed or back to a stable unloaded
// state under LoadTimeout.
func (s *state) beginLoad(e *entry) loadJob {
	ctx, cancel := context.WithCancelCause(s.base)
	a := &loadAttempt{done: make(chan struct{}), cancel: cancel, started: s.clock.Now()}
	prev := e.state
	e.attempt = a
	e.setTransient(StateLoading)
	s.gen++
	return loadJob{ctx: ctx, entry: e, attempt: a, spec: e.spec, prev: prev, gen: s.gen}
}

// refusal is the error of a refused request; retry is the hint of refusals whose
// end is not known.
func refusal(model string, e *entry, d decide.Route, retry time.Duration) error {
	switch d.Refusal {
	case decide.RefuseClosed:
		return &UnavailableError{Model: model, State: StateStopping, ErrCode: CodePoolClosed,
			Reason: "the node agent is shutting down", Retry: retry}
	case decide.RefuseUnknown:
		return &UnknownModelError{Model: model}
	case decide.RefuseRetired:
		return &UnavailableError{Model: e.spec.Name, State: e.state, ErrCode: CodeModelDraining,
			Reason: "the model is being removed from this node", Retry: retry}
	case decide.RefuseBackoff:
		return &UnavailableError{Model: e.spec.Name, State: e.state, ErrCode: CodeModelLoadFailed,
			Reason: e.failReason, Retry: d.Retry, Err: e.lastErr}
	}
	return &UnavailableError{Model: e.spec.Name, State: e.state, ErrCode: CodeModelDraining,
		Reason: "the model is being unloaded", Retry: retry}
}

// await waits for a load attempt, bounded by the request's context.
func await(ctx context.Context, model string, a *loadAttempt, retry time.Duration) error {
	select {
	case <-a.done:
		return a.err
	case <-ctx.Done():
		return &UnavailableError{Model: model, State: StateLoading, ErrCode: CodeModelLoading,
			Reason: "the model is still loading", Retry: retry, Err: context.Cause(ctx)}
	}
}

// lookup resolves a name or alias.
func (s *state) lookup(name string) *entry {
	if e, ok := s.entries[name]; ok {
		return e
	}
	if n, ok := s.aliases[name]; ok {
		return s.entries[n]
	}
	return nil
}

// signal is a non-blocking send on a one-slot wake channel.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

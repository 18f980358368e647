package enginepool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// One request's way through the pool, top-down in this file:
//
//	Acquire          a lease on a Ready engine, loading the model first if it must
//	  route          under the lock: decide.RouteRequest, then lease, join or start a load
//	  loader.await   wait for the load, bounded by the request's context
//	loader.run       the load's owner goroutine (one per Loading state):
//	  admit          decide.Admit round by round: evict, wait for unloads, measure, refuse
//	  startRunner    start the runner under its ceiling and wait until it serves
//	  loadedLocked   Ready: close the attempt, watch the runner
//	  failedLocked   the runner did not come up: tear it down, Failed (or Unloaded if canceled)
//	  refuse         admission refused: the entry goes back to where it was
//
// The request then holds its Lease (lease.go: Runner, Release), and the agent checks
// the prompt against memory with CheckPrefill (prefill.go) before the first byte.
//
// Lock discipline (ENGINE_POOL.md): the pool mutex is held to decide and to apply a
// decision, never across a runner start, a wait, a measurement or an eviction; loads
// are admitted one at a time (p.admitting), and serving a loaded model never waits
// behind them.

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
		l, a, err := p.route(model)
		if l != nil {
			l.cold = cold
		}
		if l != nil || err != nil {
			return l, err
		}
		cold = true
		if err := p.loader.await(ctx, model, a); err != nil {
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

// route decides, under the lock, what a request for model does (decide.RouteRequest)
// and applies it: a lease on a Ready engine, or the load attempt to wait for (the one
// under way, or one it starts), or the refusal.
func (p *Pool) route(model string) (*Lease, *loadAttempt, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	e := p.lookupLocked(model)
	in := decide.RouteInput{Now: now, Closed: p.closed, Known: e != nil && !e.removed}
	if in.Known {
		in.Retired, in.State, in.RetryAt = e.retired, e.state, e.retryAt
	}
	d := decide.RouteRequest(in)
	switch d.Kind {
	case decide.RouteLease:
		// A lease on e's Ready engine; it restarts e's idle clock.
		g := e.eng
		l := &Lease{pool: p, eng: g, model: e.spec.Name, offset: g.leaseLocked(now)}
		p.activity++
		e.lastUsed = now
		if g.inUse == 1 {
			signal(p.wakeActive)
		}
		return l, nil, nil
	case decide.RouteJoin:
		return nil, e.attempt, nil
	case decide.RouteLoad:
		return nil, p.loader.startLocked(e), nil
	}
	return nil, nil, refusal(model, e, d, p.cfg.RetryAfter)
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

// loader brings models in: it starts a load's owner goroutine and is that owner —
// admission, the runner's start, Ready or the teardown of a failed start. It holds
// a pointer back to the pool, whose mutex it takes to decide and apply, never across
// a start, a wait or a measurement.
type loader struct{ p *Pool }

// startLocked moves e to Loading and starts its owner goroutine, which drives it
// to Ready, Failed or back to a stable unloaded state under LoadTimeout.
func (l loader) startLocked(e *entry) *loadAttempt {
	p := l.p
	ctx, cancel := context.WithCancelCause(p.baseCtx)
	a := &loadAttempt{done: make(chan struct{}), cancel: cancel, started: p.clock.Now()}
	prev := e.state
	e.attempt = a
	e.setTransientLocked(StateLoading)
	p.gen++
	go l.run(ctx, e, a, e.spec, prev, p.gen)
	signal(p.wakeNow)
	return a
}

// await waits for a load attempt, bounded by the request's context.
func (l loader) await(ctx context.Context, model string, a *loadAttempt) error {
	p := l.p
	select {
	case <-a.done:
		return a.err
	case <-ctx.Done():
		return &UnavailableError{Model: model, State: StateLoading, ErrCode: CodeModelLoading,
			Reason: "the model is still loading", Retry: p.cfg.RetryAfter, Err: context.Cause(ctx)}
	}
}

// run is the owner of one Loading state: admission, then the runner, then Ready
// or a teardown.
func (l loader) run(ctx context.Context, e *entry, a *loadAttempt, spec ModelSpec, prev State, gen uint64) {
	p := l.p
	defer a.cancel(context.Canceled)
	ctx, stop := p.clock.withDeadline(ctx, p.cfg.LoadTimeout, "loading "+spec.Name)
	defer stop()

	g, err := l.admit(ctx, e, spec, gen)
	if err != nil {
		l.refuse(e, a, prev, err)
		return
	}
	err = l.startRunner(ctx, g, spec)
	var fp int64
	if err == nil {
		fp, _ = p.gauge.Process(g.pid)
	}
	p.mu.Lock()
	if err == nil && a.cancelReason != "" {
		err = a.cancelErr
	}
	if err == nil {
		l.loadedLocked(e, g, a, fp) // unlocks
		return
	}
	l.failedLocked(ctx, e, g, a, err) // unlocks
}

// admit asks decide.Admit, round by round, whether e may load with spec — evicting
// idle models first, waiting for unloads in progress, or refusing — and on success
// commits the reservation and returns the new engine (e.eng).
//
// Admissions are serialized (loads wait for each other, serving does not); the pool
// mutex is only taken to decide, never across a measurement or an eviction.
func (l loader) admit(ctx context.Context, e *entry, spec ModelSpec, gen uint64) (*engine, error) {
	p := l.p
	// A model that can never fit says so at once, before waiting for other admissions
	// (whose wait a pressure cancel could otherwise turn into insufficient_memory).
	p.mu.Lock()
	ceiling := p.ceiling
	p.mu.Unlock()
	if spec.EstimatedBytes > ceiling.Bytes {
		return nil, &ModelTooLargeError{Model: spec.Name, EstimatedBytes: spec.EstimatedBytes, Ceiling: ceiling}
	}
	select {
	case p.admitting <- struct{}{}:
	case <-ctx.Done():
		return nil, l.ctxLoadError(ctx, spec.Name)
	}
	defer func() { <-p.admitting }()

	req := decide.AdmitRequest{Model: spec.Name, Estimate: spec.EstimatedBytes, Measured: -1}
	for {
		p.mu.Lock()
		if req.Measured >= 0 && ctx.Err() != nil {
			p.mu.Unlock()
			return nil, l.ctxLoadError(ctx, spec.Name)
		}
		d := decide.Admit(p.decideSnapshotLocked(), req)
		g, wait, err := l.applyAdmissionLocked(e, spec, gen, d)
		p.mu.Unlock()
		if g != nil || err != nil {
			return g, err
		}
		if wait != nil {
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, l.ctxLoadError(ctx, spec.Name)
			}
		}
		req.Evicted = req.Evicted || d.Kind == decide.AdmitEvict
		req.Measured = p.meter.footprints()
	}
}

// applyAdmissionLocked applies one admission round: the engine admitted, or a channel
// to wait on before the next round, or the refusal; all nil: measure and ask again.
func (l loader) applyAdmissionLocked(e *entry, spec ModelSpec, gen uint64, d decide.Admission) (*engine, <-chan struct{}, error) {
	p := l.p
	switch d.Kind {
	case decide.AdmitLoad:
		g := newEngine(e, spec, gen, spec.EstimatedBytes)
		p.committed += spec.EstimatedBytes
		p.activity++
		e.eng = g
		return g, nil, nil
	case decide.AdmitEvict:
		p.log.V(2).Info("Evicting to admit a model", "model", spec.Name, "victim", d.Victim,
			"projectedBytes", d.Projected, "softBytes", p.ceiling.SoftBytes)
		return nil, p.unloader.startLocked(p.entries[d.Victim], ReasonEviction), nil
	case decide.AdmitWait:
		// Unloads already under way will hand their reservations back.
		if ch := l.releasingLocked(e); ch != nil {
			return nil, ch, nil
		}
	case decide.AdmitTooLarge:
		return nil, nil, &ModelTooLargeError{Model: spec.Name, EstimatedBytes: spec.EstimatedBytes, Ceiling: p.ceiling}
	case decide.AdmitMeasure:
		return nil, nil, nil
	}
	return nil, nil, &InsufficientMemoryError{Model: spec.Name, EstimatedBytes: spec.EstimatedBytes,
		CurrentBytes: d.Current, LimitBytes: d.Limit, Ceiling: p.ceiling, Pressure: p.level,
		Detail: d.Detail, Retry: p.cfg.pausedRetry()}
}

// releasingLocked is the transition of an engine being torn down (other than self's)
// to wait for, or nil.
func (l loader) releasingLocked(self *entry) <-chan struct{} {
	for g := range l.p.engines {
		if g.entry != self && g.tearingDown && g.entry.transition != nil {
			return g.entry.transition
		}
	}
	return nil
}

// ctxLoadError is the error of an admission that ctx ended: the cancel error of
// the load when someone canceled it, else ctx's cause.
func (l loader) ctxLoadError(ctx context.Context, model string) error {
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.lookupLocked(model); e != nil && e.attempt != nil && e.attempt.cancelErr != nil {
		return e.attempt.cancelErr
	}
	return fmt.Errorf("admitting %s: %w", model, context.Cause(ctx))
}

// startRunner starts the admitted engine's runner under its ceiling (runnerCeiling),
// registers it for measurement, and waits until it serves. The lock is not held
// while starting or waiting.
func (l loader) startRunner(ctx context.Context, g *engine, spec ModelSpec) error {
	p := l.p
	runner, err := p.factory.Start(ctx, spec, runnerCeiling(g.reservation))
	if err != nil {
		return err
	}
	p.mu.Lock()
	g.runner, g.pid = runner, runner.PID()
	if a, ok := runner.(interface{ Adopted() bool }); !ok || !a.Adopted() {
		g.hotBudget = 0 // a fresh runner starts without a hot tier; an adopted one's is learnt
	}
	p.engines[g] = struct{}{}
	p.activity++
	p.mu.Unlock()
	signal(p.wakeNow) // measure it and push its limits while it loads
	return runner.WaitReady(ctx)
}

// runnerCeiling is the memory ceiling a runner enforces on itself with its prefill
// guard: its reservation plus the 10% tolerance past which the enforcer unloads it. A
// reservation is an estimate, so refusing work at exactly the estimate would refuse
// prompts the enforcer lets run (a small model's runner process alone can be close to
// its estimate).
func runnerCeiling(reservation int64) int64 { return reservation + reservation/10 }

// loadedLocked makes e Ready on g (footprint fp as just measured), wakes the load's
// waiters and starts watching the runner. Called with the lock held; returns with it
// released.
func (l loader) loadedLocked(e *entry, g *engine, a *loadAttempt, fp int64) {
	p := l.p
	now := p.clock.Now()
	g.footprint, g.peak = fp, max(g.peak, fp)
	p.activity++
	g.loadedAt = now
	e.lastUsed = now
	e.attempt = nil
	e.lastErr = nil
	e.failReason = ""
	e.setStableLocked(StateReady)
	close(a.done)
	p.loads++
	obs := p.observersLocked()
	p.mu.Unlock()
	p.log.V(2).Info("Model loaded", "model", g.spec.Name, "reservedBytes", g.reservation, "duration", p.clock.Since(a.started))
	go p.unloader.watch(g)
	signal(p.wakeNow)
	for _, o := range obs {
		o.LoadFinished(LoadEvent{Model: g.spec.Name, Duration: p.clock.Since(a.started)})
	}
}

// failedLocked ends a load whose runner did not come up (err) or that was
// canceled: its waiters get the error, and the engine is torn down to Failed (or to
// Unloaded when canceled). Called with the lock held; returns with it released.
func (l loader) failedLocked(ctx context.Context, e *entry, g *engine, a *loadAttempt, err error) {
	p := l.p
	spec := g.spec
	plan := teardownPlan{reason: ReasonLoadFailed, final: StateFailed, cause: err}
	if a.cancelReason != "" {
		plan = teardownPlan{reason: ReasonLoadAborted, final: StateUnloaded}
		a.err = a.cancelErr
	} else {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%v)", err, cause)
			plan.cause = err
		}
		a.err = &UnavailableError{Model: spec.Name, State: StateFailed, ErrCode: CodeModelLoadFailed,
			Reason: err.Error(), Retry: p.cfg.backoff(e.failures + 1), Err: err}
		p.loadFailures++
	}
	g.tearingDown = true
	g.invalidateLocked(a.err)
	e.attempt = nil
	e.setTransientLocked(StateStopping)
	close(a.done)
	obs := p.observersLocked()
	p.mu.Unlock()
	p.log.Info("Model load did not complete", "model", spec.Name, "err", err.Error())
	for _, o := range obs {
		o.LoadFinished(LoadEvent{Model: spec.Name, Duration: p.clock.Since(a.started), Err: a.err})
	}
	p.unloader.teardown(e, g, plan)
}

// refuse ends a load that admission refused or that was canceled before it had a
// reservation: nothing to stop, the entry goes back to where it was.
func (l loader) refuse(e *entry, a *loadAttempt, prev State, err error) {
	p := l.p
	p.mu.Lock()
	if a.cancelReason != "" {
		err = a.cancelErr
	}
	a.err = err
	e.lastErr = err
	e.attempt = nil
	if prev.Transient() || prev == StateReady {
		prev = StateUnloaded
	}
	e.setStableLocked(prev)
	if e.removed {
		p.deleteEntryLocked(e)
	}
	close(a.done)
	obs := p.observersLocked()
	p.mu.Unlock()
	p.log.V(2).Info("Model load refused", "model", e.spec.Name, "err", err.Error())
	signal(p.wakeNow)
	for _, o := range obs {
		o.LoadFinished(LoadEvent{Model: e.spec.Name, Duration: p.clock.Since(a.started), Err: err})
	}
}

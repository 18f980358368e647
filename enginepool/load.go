package enginepool

import (
	"context"
	"errors"
	"fmt"
)

// startLoadLocked moves e to Loading and starts its owner goroutine, which drives it
// to Ready, Failed or back to a stable unloaded state under LoadTimeout.
func (p *Pool) startLoadLocked(e *entry) *loadAttempt {
	ctx, cancel := context.WithCancelCause(p.baseCtx)
	a := &loadAttempt{done: make(chan struct{}), cancel: cancel, started: p.clock.Now()}
	prev := e.state
	e.attempt = a
	e.setTransientLocked(StateLoading)
	p.gen++
	go p.runLoad(ctx, e, a, e.spec, prev, p.gen)
	p.signal(p.wakeNow)
	return a
}

// runLoad is the owner of one Loading state.
func (p *Pool) runLoad(ctx context.Context, e *entry, a *loadAttempt, spec ModelSpec, prev State, gen uint64) {
	defer a.cancel(context.Canceled)
	ctx, stop := p.withDeadline(ctx, p.cfg.LoadTimeout, "loading "+spec.Name)
	defer stop()
	log := p.log.WithValues("model", spec.Name)

	g, err := p.admit(ctx, e, spec, gen)
	if err != nil {
		p.refuseLoad(e, a, prev, err)
		return
	}
	runner, err := p.factory.Start(ctx, spec, runnerCeiling(g.reservation))
	if err == nil {
		p.mu.Lock()
		g.runner, g.pid = runner, runner.PID()
		if a, ok := runner.(interface{ Adopted() bool }); !ok || !a.Adopted() {
			g.hotBudget = 0 // a fresh runner starts without a hot tier; an adopted one's is learnt
		}
		p.engines[g] = struct{}{}
		p.activity++
		p.mu.Unlock()
		p.signal(p.wakeNow) // measure it and push its limits while it loads
		err = runner.WaitReady(ctx)
	}

	var fp int64
	if err == nil {
		fp, _ = p.gauge.Process(g.pid)
	}
	p.mu.Lock()
	if err == nil && a.cancelReason != "" {
		err = a.cancelErr
	}
	if err == nil {
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
		log.V(2).Info("Model loaded", "reservedBytes", g.reservation, "duration", p.clock.Since(a.started))
		go p.watch(g)
		p.signal(p.wakeNow)
		for _, o := range obs {
			o.LoadFinished(LoadEvent{Model: spec.Name, Duration: p.clock.Since(a.started)})
		}
		return
	}

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
			Reason: err.Error(), Retry: p.backoff(e.failures + 1), Err: err}
		p.loadFailures++
	}
	g.tearingDown = true
	g.invalidateLocked(a.err)
	e.attempt = nil
	e.setTransientLocked(StateStopping)
	close(a.done)
	obs := p.observersLocked()
	p.mu.Unlock()
	log.Info("Model load did not complete", "err", err.Error())
	for _, o := range obs {
		o.LoadFinished(LoadEvent{Model: spec.Name, Duration: p.clock.Since(a.started), Err: a.err})
	}
	p.teardown(e, g, plan)
}

// refuseLoad ends a load that admission refused or that was canceled before it had a
// reservation: nothing to stop, the entry goes back to where it was.
func (p *Pool) refuseLoad(e *entry, a *loadAttempt, prev State, err error) {
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
	p.signal(p.wakeNow)
	for _, o := range obs {
		o.LoadFinished(LoadEvent{Model: e.spec.Name, Duration: p.clock.Since(a.started), Err: err})
	}
}

// loadCanceledError is what waiters of a load canceled for reason get.
func (p *Pool) loadCanceledErrorLocked(e *entry, reason UnloadReason) error {
	if reason == ReasonPressure {
		return &InsufficientMemoryError{Model: e.spec.Name, EstimatedBytes: e.spec.EstimatedBytes,
			CurrentBytes: max(p.usage, p.committed), LimitBytes: p.ceiling.HardBytes, Ceiling: p.ceiling,
			Pressure: p.level, Detail: "the load was aborted under memory pressure", Retry: p.pausedRetry()}
	}
	return &UnavailableError{Model: e.spec.Name, State: StateLoading, ErrCode: CodeModelDraining,
		Reason: fmt.Sprintf("the load was canceled (%s)", reason), Retry: p.cfg.RetryAfter}
}

// watch turns an unexpected runner exit into a teardown that ends in Failed.
func (p *Pool) watch(g *engine) {
	select {
	case <-g.runner.Exited():
	case <-g.stopped:
		return
	}
	p.mu.Lock()
	e := g.entry
	if g.tearingDown || e.eng != g {
		p.mu.Unlock()
		return
	}
	cause := g.runner.ExitErr()
	if cause == nil {
		cause = errors.New("the runner exited unexpectedly")
	}
	g.tearingDown = true
	g.invalidateLocked(engineStoppedError(g.name, ReasonCrash, cause, p.cfg.RetryAfter))
	e.setTransientLocked(StateStopping)
	p.crashes++
	p.mu.Unlock()
	p.log.Info("Runner exited unexpectedly", "model", g.name, "pid", g.pid, "err", cause.Error())
	p.teardown(e, g, teardownPlan{reason: ReasonCrash, final: StateFailed, cause: cause, crashed: true})
}

// runnerCeiling is the memory ceiling a runner enforces on itself with its prefill
// guard: its reservation plus the 10% tolerance past which the enforcer unloads it. A
// reservation is an estimate, so refusing work at exactly the estimate would refuse
// prompts the enforcer lets run (a small model's runner process alone can be close to
// its estimate).
func runnerCeiling(reservation int64) int64 { return reservation + reservation/10 }

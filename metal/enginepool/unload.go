package enginepool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
)

// unloader stops engines: it hands an entry to an unload owner (or cancels its load),
// and is that owner — drain, stop, settle, release, report — for unloads and
// crashes alike. It holds a pointer back to the pool, whose mutex it takes only
// between the steps, never across a wait.
type unloader struct{ p *Pool }

// teardownPlan says how one engine is taken down.
type teardownPlan struct {
	reason UnloadReason
	// final is StateUnloaded or StateFailed.
	final State
	// cause is the failure behind a Failed final state.
	cause error
	// drain is the graceful wait for leases before aborting; zero aborts at once.
	drain time.Duration
	// crashed: the process is already gone, so there is nothing to abort and the
	// host gauge cannot show this unload.
	crashed bool
}

// StartUnload begins unloading model (admin) and returns a channel closed once it is
// unloaded. Unloading a model that is not loaded returns a closed channel; unloading
// one that is loading cancels the load.
func (p *Pool) StartUnload(model string) (<-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.lookupLocked(model)
	if e == nil || e.removed {
		return nil, &UnknownModelError{Model: model}
	}
	return p.unloader.startLocked(e, ReasonAdmin), nil
}

// Unload unloads model and waits for it, bounded by ctx. It returns the report of the
// engine it stopped, or nil when the model was not loaded.
func (p *Pool) Unload(ctx context.Context, model string) (*UnloadReport, error) {
	p.mu.Lock()
	e := p.lookupLocked(model)
	if e == nil || e.removed {
		p.mu.Unlock()
		return nil, &UnknownModelError{Model: model}
	}
	before := e.lastUnload
	done := p.unloader.startLocked(e, ReasonAdmin)
	p.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("unloading %s: %w", model, context.Cause(ctx))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e.lastUnload == nil || e.lastUnload == before {
		return nil, nil // nothing was running (or a load was canceled before its runner started)
	}
	r := *e.lastUnload
	return &r, nil
}

// startLocked hands e to an unload owner (or cancels its load) and returns a
// channel closed when e is stable again. It is idempotent.
func (u unloader) startLocked(e *entry, reason UnloadReason) <-chan struct{} {
	p := u.p
	switch e.state {
	case StateReady:
		g := e.eng
		g.tearingDown = true
		e.setTransientLocked(StateDraining)
		drain := p.cfg.DrainTimeout
		if !reason.graceful() {
			drain = p.cfg.PressureDrainTimeout
		}
		go u.teardown(e, g, teardownPlan{reason: reason, final: StateUnloaded, drain: drain})
		return e.transition
	case StateLoading:
		if a := e.attempt; a != nil && a.cancelReason == "" {
			a.cancelReason = reason
			a.cancelErr = u.loadCanceledErrorLocked(e, reason)
			a.cancel(a.cancelErr)
		}
		return e.transition
	case StateDraining, StateStopping:
		return e.transition
	}
	return closedChan()
}

// teardown is the single owner of an engine's Draining and Stopping states:
// drain → abort → wait for request goroutines → stop → settle → release the
// reservation → report. Every wait has a deadline; the pool mutex is never held
// across any of them.
func (u unloader) teardown(e *entry, g *engine, plan teardownPlan) {
	p := u.p
	start := p.clock.Now()
	log := p.log.WithValues("model", g.name, "reason", string(plan.reason))
	aborted := u.drain(g, plan, log)
	report := u.stopAndSettle(e, g, plan, log)

	// 4. Release the reservation, only now; 5. report.
	p.mu.Lock()
	now := p.clock.Now()
	if report != nil {
		report.Aborted, report.Time, report.Duration = aborted, now, now.Sub(start)
	}
	u.releaseLocked(e, g, plan, report, now)
	obs := p.observersLocked()
	p.mu.Unlock()

	signal(p.wakeNow)
	if report != nil {
		log.V(2).Info("Model unloaded", "outcome", string(report.Outcome), "freedBytes", report.FreedBytes,
			"residentBytes", report.ResidentBytes, "duration", report.Duration)
		for _, o := range obs {
			o.Unloaded(g.name, *report)
		}
	}
}

// drain is step 1 of a teardown: wait for leases up to the plan's drain deadline,
// abort what remains, wait for the request goroutines to return. It returns how
// many generations the abort ended.
func (u unloader) drain(g *engine, plan teardownPlan, log logr.Logger) int {
	p := u.p
	aborted := 0
	released := u.awaitReleased(g, plan.drain)
	if !released && !plan.crashed && g.runner != nil {
		ctx, cancel := p.clock.withDeadline(context.Background(), p.cfg.RunnerCallTimeout, "aborting "+g.name)
		n, err := g.runner.Abort(ctx)
		cancel()
		aborted = n
		if err != nil {
			log.Info("Aborting in-flight requests failed", "err", err.Error())
		}
	}
	if !released {
		if !u.awaitReleased(g, p.cfg.AbortWaitTimeout) {
			log.Info("Requests still hold the engine after abort; stopping it anyway")
		}
	}
	return aborted
}

// stopAndSettle is steps 2 and 3 of a teardown: invalidate the engine's handles,
// reset its counters, stop and reap the runner, and wait for the settle barrier.
// It returns the unload's report without its timing (nil when no runner had
// started).
func (u unloader) stopAndSettle(e *entry, g *engine, plan teardownPlan, log logr.Logger) *UnloadReport {
	p := u.p
	p.mu.Lock()
	if e.eng == g && e.state != StateStopping {
		e.setTransientLocked(StateStopping)
	}
	g.invalidateLocked(engineStoppedError(g.name, plan.reason, plan.cause, p.cfg.RetryAfter))
	g.inUse = 0
	g.activeReported = 0
	if g.released != nil {
		close(g.released)
		g.released = nil
	}
	resident := g.footprint
	runner, pid := g.runner, g.pid
	activity := p.activity
	p.mu.Unlock()
	if runner == nil {
		return nil
	}

	if !plan.crashed {
		if fp, err := p.gauge.Process(pid); err == nil && fp > 0 {
			resident = fp
		}
	}
	pre, preErr := p.gauge.Host()
	devPre, devOK := deviceBefore(context.Background(), p.cfg.DeviceGauge)
	ctx, cancel := p.clock.withDeadline(context.Background(), p.cfg.StopTimeout, "stopping "+g.name)
	if err := runner.Stop(ctx, p.cfg.StopGrace); err != nil {
		log.Info("Stopping the runner failed", "pid", pid, "err", err.Error())
	}
	cancel()
	outcome, freed := Indeterminate, resident
	if !plan.crashed && preErr == nil {
		outcome, freed = p.settler.settle(e, activity, pre.UsedBytes, resident)
	}
	report := &UnloadReport{Reason: plan.reason, FreedBytes: max(freed, 0), ResidentBytes: resident, Outcome: outcome}
	if devOK {
		report.DeviceFreedBytes = deviceFreed(context.Background(), p.cfg.DeviceGauge, devPre, p.clock.Sleep,
			deviceSettleInterval, int(p.cfg.SettleTimeout/deviceSettleInterval))
	}
	return report
}

// releaseLocked is steps 4 and 5 of a teardown: the reservation goes back,
// the report is kept and counted, and the entry reaches its final state (Failed
// with a backoff, or Unloaded).
func (u unloader) releaseLocked(e *entry, g *engine, plan teardownPlan, report *UnloadReport, now time.Time) {
	p := u.p
	p.committed -= g.reservation
	delete(p.engines, g)
	if report != nil {
		e.lastUnload = report
		p.unloads++
		p.freedTotal += report.FreedBytes
		if plan.reason.evicts() {
			p.evictions++
		}
	}
	if e.eng != g {
		return
	}
	e.eng = nil
	if plan.final == StateFailed {
		if !g.loadedAt.IsZero() && now.Sub(g.loadedAt) >= p.cfg.BackoffMax {
			e.failures = 0 // it ran long enough: start the backoff afresh
		}
		e.failures++
		e.retryAt = now.Add(p.cfg.backoff(e.failures))
		if plan.cause != nil {
			e.failReason = plan.cause.Error()
			e.lastErr = plan.cause
		}
	} else if !g.loadedAt.IsZero() {
		e.failures = 0
	}
	e.setStableLocked(plan.final)
	if e.removed {
		p.deleteEntryLocked(e)
	}
}

// awaitReleased waits up to d (on the injected clock) for g's leases to reach zero.
func (u unloader) awaitReleased(g *engine, d time.Duration) bool {
	p := u.p
	p.mu.Lock()
	if g.inUse == 0 {
		p.mu.Unlock()
		return true
	}
	if g.released == nil {
		g.released = make(chan struct{})
	}
	ch := g.released
	p.mu.Unlock()
	return p.clock.waitFor(ch, d)
}

// Retire takes model out of service for good while keeping it registered: from now
// on every Acquire and Load gets the 503 of a draining model (CodeModelDraining, so
// that a gateway retries elsewhere), a load in progress is canceled, and a loaded
// engine is drained — its leases are waited for as for an admin unload — stopped and
// measured (reason ReasonRetired), its report kept in the entry's snapshot. The
// returned channel is closed once the model is unloaded. Retire is idempotent; only
// Remove ends a retired entry.
func (p *Pool) Retire(model string) (<-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.lookupLocked(model)
	if e == nil || e.removed {
		return nil, &UnknownModelError{Model: model}
	}
	e.retired = true
	return p.unloader.startLocked(e, ReasonRetired), nil
}

// loadCanceledErrorLocked is what waiters of a load canceled for reason get.
func (u unloader) loadCanceledErrorLocked(e *entry, reason UnloadReason) error {
	p := u.p
	if reason == ReasonPressure {
		return &InsufficientMemoryError{Model: e.spec.Name, EstimatedBytes: e.spec.EstimatedBytes,
			CurrentBytes: max(p.usage, p.committed), LimitBytes: p.ceiling.HardBytes, Ceiling: p.ceiling,
			Pressure: p.level, Detail: "the load was aborted under memory pressure", Retry: p.cfg.pausedRetry()}
	}
	return &UnavailableError{Model: e.spec.Name, State: StateLoading, ErrCode: CodeModelDraining,
		Reason: fmt.Sprintf("the load was canceled (%s)", reason), Retry: p.cfg.RetryAfter}
}

// watch turns an unexpected runner exit into a teardown that ends in Failed.
func (u unloader) watch(g *engine) {
	p := u.p
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
	u.teardown(e, g, teardownPlan{reason: ReasonCrash, final: StateFailed, cause: cause, crashed: true})
}

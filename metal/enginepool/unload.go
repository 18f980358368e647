package enginepool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// unloader stops engines: it is the owner goroutine of each teardown — drain, stop,
// settle, release, report — for unloads and crashes alike. It takes the state's lock
// only through the state's teardown steps, between its waits, never across one.
type unloader struct {
	deps
	st *state
}

// teardownJob is one engine to take down, handed over by the state (beginUnload, a
// failed load, a crash) to the unloader.
type teardownJob struct {
	e    *entry
	g    *engine
	plan teardownPlan
}

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
	return p.unregister(change{kind: changeUnload, model: model})
}

// Unload unloads model and waits for it, bounded by ctx. It returns the report of the
// engine it stopped, or nil when the model was not loaded.
func (p *Pool) Unload(ctx context.Context, model string) (*UnloadReport, error) {
	out := p.st.change(change{kind: changeUnload, model: model})
	if out.err != nil {
		return nil, out.err
	}
	p.unloader.start(out.jobs)
	select {
	case <-out.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("unloading %s: %w", model, context.Cause(ctx))
	}
	last := p.st.view(query{entry: out.entry}).lastUnload
	if last == nil || last == out.lastUnload {
		return nil, nil // nothing was running (or a load was canceled before its runner started)
	}
	r := *last
	return &r, nil
}

// Retire takes model out of service for good while keeping it registered: from now
// on every Acquire and Load gets the 503 of a draining model (CodeModelDraining, so
// that a gateway retries elsewhere), a load in progress is canceled, and a loaded
// engine is drained — its leases are waited for as for an admin unload — stopped and
// measured (reason ReasonRetired), its report kept in the entry's snapshot. The
// returned channel is closed once the model is unloaded. Retire is idempotent; only
// Remove ends a retired entry.
func (p *Pool) Retire(model string) (<-chan struct{}, error) {
	return p.unregister(change{kind: changeRetire, model: model})
}

// start starts an owner goroutine for each job.
func (u unloader) start(jobs []teardownJob) {
	for _, job := range jobs {
		go u.teardown(job)
	}
}

// teardown is the single owner of an engine's Draining and Stopping states:
// drain → abort → wait for request goroutines → stop → settle → release the
// reservation → report. Every wait has a deadline; the state's lock is never held
// across any of them.
func (u unloader) teardown(job teardownJob) {
	start := u.clock.Now()
	log := u.log.WithValues("model", job.g.name, "reason", string(job.plan.reason))
	aborted := u.drain(job, log)
	report := u.stopAndSettle(job, log)

	// 4. Release the reservation, only now; 5. report.
	r := u.st.teardown(teardownStep{kind: stepRelease, job: job, report: report, aborted: aborted, start: start})
	signal(u.wake.now)
	if report != nil {
		log.V(2).Info("Model unloaded", "outcome", string(report.Outcome), "freedBytes", report.FreedBytes,
			"residentBytes", report.ResidentBytes, "duration", report.Duration)
		for _, o := range r.observers {
			o.Unloaded(job.g.name, *report)
		}
	}
}

// drain is step 1 of a teardown: wait for leases up to the plan's drain deadline,
// abort what remains, wait for the request goroutines to return. It returns how
// many generations the abort ended.
func (u unloader) drain(job teardownJob, log logr.Logger) int {
	g, plan := job.g, job.plan
	aborted := 0
	released := u.awaitReleased(job, plan.drain)
	if !released && !plan.crashed && g.runner != nil {
		ctx, cancel := u.clock.withDeadline(context.Background(), u.cfg.RunnerCallTimeout, "aborting "+g.name)
		n, err := g.runner.Abort(ctx)
		cancel()
		aborted = n
		if err != nil {
			log.Info("Aborting in-flight requests failed", "err", err.Error())
		}
	}
	if !released {
		if !u.awaitReleased(job, u.cfg.AbortWaitTimeout) {
			log.Info("Requests still hold the engine after abort; stopping it anyway")
		}
	}
	return aborted
}

// awaitReleased waits up to d (on the injected clock) for the engine's leases to
// reach zero.
func (u unloader) awaitReleased(job teardownJob, d time.Duration) bool {
	r := u.st.teardown(teardownStep{kind: stepAwait, job: job})
	return r.released == nil || u.clock.waitFor(r.released, d)
}

// stopAndSettle is steps 2 and 3 of a teardown: invalidate the engine's handles,
// reset its counters, stop and reap the runner, and wait for the settle barrier.
// It returns the unload's report without its timing (nil when no runner had
// started).
func (u unloader) stopAndSettle(job teardownJob, log logr.Logger) *UnloadReport {
	plan := job.plan
	r := u.st.teardown(teardownStep{kind: stepStop, job: job})
	if r.runner == nil {
		return nil
	}
	resident := r.resident
	if !plan.crashed {
		if fp, err := u.gauge.Process(r.pid); err == nil && fp > 0 {
			resident = fp
		}
	}
	pre, preErr := u.gauge.Host()
	devPre, devOK := deviceBefore(context.Background(), u.cfg.DeviceGauge)
	ctx, cancel := u.clock.withDeadline(context.Background(), u.cfg.StopTimeout, "stopping "+job.g.name)
	if err := r.runner.Stop(ctx, u.cfg.StopGrace); err != nil {
		log.Info("Stopping the runner failed", "pid", r.pid, "err", err.Error())
	}
	cancel()
	outcome, freed := Indeterminate, resident
	if !plan.crashed && preErr == nil {
		outcome, freed = u.settle(job.e, r.activity, pre.UsedBytes, resident)
	}
	report := &UnloadReport{Reason: plan.reason, FreedBytes: max(freed, 0), ResidentBytes: resident, Outcome: outcome}
	if devOK {
		report.DeviceFreedBytes = deviceFreed(context.Background(), u.cfg.DeviceGauge, devPre, u.clock.Sleep,
			deviceSettleInterval, int(u.cfg.SettleTimeout/deviceSettleInterval))
	}
	return report
}

// watch turns an unexpected runner exit into a teardown that ends in Failed.
func (u unloader) watch(g *engine) {
	select {
	case <-g.runner.Exited():
	case <-g.stopped:
		return
	}
	cause := g.runner.ExitErr()
	if cause == nil {
		cause = errors.New("the runner exited unexpectedly")
	}
	job := teardownJob{g.entry, g, teardownPlan{reason: ReasonCrash, final: StateFailed, cause: cause, crashed: true}}
	if r := u.st.teardown(teardownStep{kind: stepCrash, job: job}); !r.crashed {
		return
	}
	u.log.Info("Runner exited unexpectedly", "model", g.name, "pid", g.pid, "err", cause.Error())
	u.teardown(job)
}

// teardownStepKind names a step of a teardown.
type teardownStepKind int

const (
	// stepAwait: are the leases gone? If not, the channel to wait on.
	stepAwait teardownStepKind = iota
	// stepStop: Stopping; the handles invalidated and the counters reset before the
	// runner is stopped.
	stepStop
	// stepRelease: the reservation back, the report kept and counted, the final state.
	stepRelease
	// stepCrash: the runner exited on its own; Stopping unless someone already owns it.
	stepCrash
	// stepBusy: is anything else loading or serving, or has anything run since the
	// activity count (the settle barrier's bail-out)?
	stepBusy
)

// teardownStep is a step of a teardown to apply.
type teardownStep struct {
	kind    teardownStepKind
	job     teardownJob
	report  *UnloadReport
	aborted int
	start   time.Time
	// activity is the count stepBusy compares.
	activity uint64
}

// tornDown is what a teardown step read or leaves to do.
type tornDown struct {
	released <-chan struct{}
	// What stepStop read: the runner to stop, its pid and last footprint, and the
	// activity count at that moment.
	runner    Runner
	pid       int
	resident  int64
	activity  uint64
	crashed   bool
	busy      bool
	observers []Observer
}

// teardown applies a step of a teardown.
func (s *state) teardown(step teardownStep) tornDown {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, g, plan := step.job.e, step.job.g, step.job.plan
	switch step.kind {
	case stepAwait:
		if g.inUse == 0 {
			return tornDown{}
		}
		if g.released == nil {
			g.released = make(chan struct{})
		}
		return tornDown{released: g.released}
	case stepStop:
		if e.eng == g && e.state != StateStopping {
			e.setTransient(StateStopping)
		}
		g.invalidate(engineStoppedError(g.name, plan.reason, plan.cause, s.cfg.RetryAfter))
		g.inUse, g.activeReported = 0, 0
		if g.released != nil {
			close(g.released)
			g.released = nil
		}
		return tornDown{runner: g.runner, pid: g.pid, resident: g.footprint, activity: s.activity}
	case stepCrash:
		if g.tearingDown || e.eng != g {
			return tornDown{}
		}
		g.tearingDown = true
		g.invalidate(engineStoppedError(g.name, ReasonCrash, plan.cause, s.cfg.RetryAfter))
		e.setTransient(StateStopping)
		s.crashes++
		return tornDown{crashed: true}
	case stepBusy:
		name := ""
		if e != nil {
			name = e.spec.Name
		}
		return tornDown{busy: s.activity != step.activity || decide.OthersBusy(s.decideModels(), name)}
	}
	now := s.clock.Now()
	if r := step.report; r != nil {
		r.Aborted, r.Time, r.Duration = step.aborted, now, now.Sub(step.start)
	}
	s.released(step.job, step.report, now)
	return tornDown{observers: s.observed()}
}

// released is steps 4 and 5 of a teardown: the reservation goes back, the report is
// kept and counted, and the entry reaches its final state (Failed with a backoff, or
// Unloaded).
func (s *state) released(job teardownJob, report *UnloadReport, now time.Time) {
	e, g, plan := job.e, job.g, job.plan
	s.committed -= g.reservation
	delete(s.engines, g)
	if report != nil {
		e.lastUnload = report
		s.unloads++
		s.freedTotal += report.FreedBytes
		if plan.reason.evicts() {
			s.evictions++
		}
	}
	if e.eng != g {
		return
	}
	e.eng = nil
	if plan.final == StateFailed {
		if !g.loadedAt.IsZero() && now.Sub(g.loadedAt) >= s.cfg.BackoffMax {
			e.failures = 0 // it ran long enough: start the backoff afresh
		}
		e.failures++
		e.retryAt = now.Add(s.cfg.backoff(e.failures))
		if plan.cause != nil {
			e.failReason = plan.cause.Error()
			e.lastErr = plan.cause
		}
	} else if !g.loadedAt.IsZero() {
		e.failures = 0
	}
	e.setStable(plan.final)
	if e.removed {
		s.deleteEntry(e)
	}
}

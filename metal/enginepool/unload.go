package enginepool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/internal/devicegauge"
	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// A model's way out. Every unload — an eviction, an idle, pressure or admin unload, a
// removal, a failed start, a crash — is one teardown with one owner, unloader.teardown,
// which takes the state's lock only through state.teardown, one step at a time, and
// never across a wait (each wait has a deadline on the injected clock):
//
//	state.beginUnload     a Ready entry goes to an unload owner; a Loading one is canceled
//	unloader.teardown     the owner of one Draining and Stopping state
//	  drain               wait for the leases, abort what remains, wait for the requests
//	  stopAndSettle       stop and reap the runner; the settle barrier (settle)
//	  release             the reservation back, the report (state.released)
//	unloader.watch        a runner's crash becomes a teardown that ends in Failed
//	state.failed          a load whose runner did not come up goes to a teardown
//	state.refused         a load refused before it had a reservation goes back
//
// The entry's transitions (setTransient, setStable) and the engine's invalidation,
// which the state's methods apply with the lock held, are here too.

// unloader stops engines: it is the owner goroutine of each teardown — drain, stop,
// settle, release, report — for unloads and crashes alike. It takes the state's lock
// only through the state's teardown steps, between its waits, never across one.
type unloader struct {
	deps
	st *state
}

// start starts an owner goroutine for each job.
func (u unloader) start(jobs []teardownJob) {
	for _, job := range jobs {
		go u.teardown(job)
	}
}

// beginUnload hands e to an unload owner — the job to start — or cancels its load,
// and returns a channel closed when e is stable again. It is idempotent.
func (s *state) beginUnload(e *entry, reason UnloadReason) (<-chan struct{}, *teardownJob) {
	switch e.state {
	case StateReady:
		g := e.eng
		g.tearingDown = true
		e.setTransient(StateDraining)
		drain := s.cfg.DrainTimeout
		if !reason.graceful() {
			drain = s.cfg.PressureDrainTimeout
		}
		return e.transition, &teardownJob{e, g, teardownPlan{reason: reason, final: StateUnloaded, drain: drain}}
	case StateLoading:
		if a := e.attempt; a != nil && a.cancelReason == "" {
			a.cancelReason = reason
			a.cancelErr = s.loadCanceledError(e, reason)
			a.cancel(a.cancelErr)
		}
		return e.transition, nil
	case StateDraining, StateStopping:
		return e.transition, nil
	}
	return closedChan(), nil
}

// loadCanceledError is what waiters of a load canceled for reason get.
func (s *state) loadCanceledError(e *entry, reason UnloadReason) error {
	if reason == ReasonPressure {
		return &InsufficientMemoryError{Model: e.spec.Name, EstimatedBytes: e.spec.EstimatedBytes,
			CurrentBytes: max(s.usage, s.committed), LimitBytes: s.ceiling.HardBytes, Ceiling: s.ceiling,
			Pressure: s.level, Detail: "the load was aborted under memory pressure", Retry: s.cfg.pausedRetry()}
	}
	return &UnavailableError{Model: e.spec.Name, State: StateLoading, ErrCode: CodeModelDraining,
		Reason: fmt.Sprintf("the load was canceled (%s)", reason), Retry: s.cfg.RetryAfter}
}

// graceful reasons wait the long drain deadline; pressure reasons the short one.
func (r UnloadReason) graceful() bool {
	switch r {
	case ReasonPressure, ReasonOverCeiling:
		return false
	}
	return true
}

func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
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
		var err error
		u.runnerCall(u.cfg.RunnerCallTimeout, "aborting the in-flight requests", func(ctx context.Context) {
			aborted, err = g.runner.Abort(ctx)
		})
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

// waitFor waits for ch up to d on the clock. It reports whether ch closed.
func (c ownerClock) waitFor(ch <-chan struct{}, d time.Duration) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
	}
	if d <= 0 {
		return false
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C():
		return false
	}
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
	u.runnerCall(u.cfg.StopTimeout, "stopping the runner", func(ctx context.Context) {
		if err := r.runner.Stop(ctx, u.cfg.StopGrace); err != nil {
			log.Info("Stopping the runner failed", "pid", r.pid, "err", err.Error())
		}
	})
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

// runnerCall makes one call of a teardown to the engine's runner, with a context the
// clock cancels after d (what names the call in the deadline's error; the model is in
// the logs' keys already).
func (u unloader) runnerCall(d time.Duration, what string, call func(ctx context.Context)) {
	ctx, cancel := u.clock.withDeadline(context.Background(), d, what)
	defer cancel()
	call(ctx)
}

// settle is the settle barrier of an unload (ENGINE_POOL.md, step 3): it waits for
// the host gauge to give back what a stopped runner held, sampling at once and then
// as decide.Settle says, until it says the barrier is done. pre is the host's used
// memory sampled before the runner was stopped and resident the runner's footprint;
// activity is the state's activity count when pre was taken (anything that loaded or
// took a request since makes the gauge unattributable). A TimedOut barrier wakes the
// enforcer. It runs in the unload's owner goroutine and holds no lock while waiting:
// it asks the state only whether anything else ran meanwhile.
func (u unloader) settle(self *entry, activity uint64, pre, resident int64) (SettleOutcome, int64) {
	s := decide.SettleSample{Deadline: u.clock.Now().Add(u.cfg.SettleTimeout), Interval: u.cfg.SettleInterval,
		Pre: pre, Resident: resident, ToleranceFloor: u.cfg.SettleToleranceBytes}
	busy := teardownStep{kind: stepBusy, job: teardownJob{e: self}, activity: activity}
	for {
		s.OthersBusy, s.HostOK = u.st.teardown(busy).busy, false
		if !s.OthersBusy {
			if hm, err := u.gauge.Host(); err == nil {
				s.Used, s.HostOK = hm.UsedBytes, true
			}
		}
		s.Now = u.clock.Now()
		step := decide.Settle(s)
		if step.Kind == decide.SettleDone {
			if step.Outcome == TimedOut {
				signal(u.wake.now)
			}
			return step.Outcome, step.Freed
		}
		s.Freed = step.Freed
		t := u.clock.NewTimer(step.Wait)
		<-t.C()
	}
}

// An unload's freed device memory, on a machine whose accelerators have memory of
// their own (docs/architecture.md, "Two memory domains"). The host gauge settles the
// footprint; the cards are read from their driver before the runner stops and after it
// is gone, so that the report holds what the card got back — the runner's buffers, its
// CUDA context and the backend's pool alike — not what the runner said it held.

// deviceBefore reads the cards' used memory before a runner stops: ok false where the
// pool has no device gauge (a Mac) or the reading failed.
func deviceBefore(ctx context.Context, g devicegauge.Gauge) (used int64, ok bool) {
	if g == nil {
		return 0, false
	}
	cards, err := g.Cards(ctx)
	if err != nil || len(cards) == 0 {
		return 0, false
	}
	return devicegauge.Used(cards), true
}

// deviceSettleInterval spaces the cards' readings after a runner is reaped. The
// driver releases a process's memory as the process goes, so by the first reading the
// drop is normally whole and the second only confirms it; spaced at the host
// barrier's 250 ms that confirmation made an unload 1.7x slower than the peer's on an
// H100. A reading through the driver's tool itself takes tens of milliseconds.
const deviceSettleInterval = 50 * time.Millisecond

// deviceFreed is how far the cards' used memory fell from before: read every interval
// until two readings agree within slack (the driver has finished releasing the
// process's memory) or attempts run out. Never negative: another process allocating
// meanwhile shows as nothing freed, not as a debt.
func deviceFreed(ctx context.Context, g devicegauge.Gauge, before int64, wait func(time.Duration), interval time.Duration,
	attempts int) int64 {
	const slack = 1 << 20
	last := int64(-1)
	for range max(attempts, 1) {
		cards, err := g.Cards(ctx)
		if err != nil {
			break
		}
		used := devicegauge.Used(cards)
		if last >= 0 && abs64(used-last) <= slack {
			last = used
			break
		}
		last = used
		wait(interval)
	}
	if last < 0 {
		return 0
	}
	return max(before-last, 0)
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
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
	signal(s.wake.now)
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

// evicts says whether the reason counts as an eviction in the pool's counters.
func (r UnloadReason) evicts() bool {
	return r == ReasonEviction || r == ReasonPressure || r == ReasonOverCeiling
}

// engineStoppedError is what leases of a stopped engine report.
func engineStoppedError(model string, reason UnloadReason, cause error, retry time.Duration) error {
	msg := fmt.Sprintf("the engine was stopped (%s)", reason)
	if cause != nil {
		msg = fmt.Sprintf("the engine stopped (%s): %v", reason, cause)
	}
	return &UnavailableError{Model: model, State: StateStopping, ErrCode: CodeEngineStopped,
		Reason: msg, Retry: retry, Err: cause}
}

// failed ends a load whose runner did not come up (err) or that was canceled: its
// waiters get the error, and the engine goes to a teardown that ends in Failed (or in
// Unloaded when canceled).
func (s *state) failed(e *entry, g *engine, a *loadAttempt, err, cause error) loadApplied {
	plan := teardownPlan{reason: ReasonLoadFailed, final: StateFailed, cause: err}
	if a.cancelReason != "" {
		plan = teardownPlan{reason: ReasonLoadAborted, final: StateUnloaded}
		a.err = a.cancelErr
	} else {
		if cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%v)", err, cause)
			plan.cause = err
		}
		a.err = &UnavailableError{Model: g.spec.Name, State: StateFailed, ErrCode: CodeModelLoadFailed,
			Reason: err.Error(), Retry: s.cfg.backoff(e.failures + 1), Err: err}
		s.loadFailures++
	}
	g.tearingDown = true
	g.invalidate(a.err)
	e.attempt = nil
	e.setTransient(StateStopping)
	close(a.done)
	return loadApplied{teardown: &teardownJob{e, g, plan}, err: err, observers: s.observed()}
}

// refused ends a load that admission refused or that was canceled before it had a
// reservation: nothing to stop, the entry goes back to where it was.
func (s *state) refused(e *entry, a *loadAttempt, prev State, err error) {
	if a.cancelReason != "" {
		err = a.cancelErr
	}
	a.err = err
	e.lastErr = err
	e.attempt = nil
	if prev.Transient() || prev == StateReady {
		prev = StateUnloaded
	}
	e.setStable(prev)
	if e.removed {
		s.deleteEntry(e)
	}
	close(a.done)
}

// backoff is the wait before the next load after failures consecutive failures.
func (c Config) backoff(failures int) time.Duration {
	d := c.BackoffInitial
	for i := 1; i < failures && d < c.BackoffMax; i++ {
		d *= 2
	}
	return min(d, c.BackoffMax)
}

// setStable moves e to a stable state and wakes everyone waiting for it. The
// state's lock is held.
func (e *entry) setStable(s State) {
	e.state = s
	if e.transition != nil {
		close(e.transition)
		e.transition = nil
	}
}

// setTransient moves e to a transient state, opening a transition if needed. The
// state's lock is held.
func (e *entry) setTransient(s State) {
	e.state = s
	if e.transition == nil {
		e.transition = make(chan struct{})
	}
}

// invalidate closes the engine's handle: leases report err from now on. The
// state's lock is held.
func (g *engine) invalidate(err error) {
	select {
	case <-g.stopped:
		return
	default:
	}
	g.stopErr = err
	close(g.stopped)
}

// deleteEntry drops e and its aliases from the tables (if e is still the entry of
// its name).
func (s *state) deleteEntry(e *entry) {
	if s.entries[e.spec.Name] != e {
		return
	}
	delete(s.entries, e.spec.Name)
	for _, a := range e.spec.Aliases {
		if s.aliases[a] == e.spec.Name {
			delete(s.aliases, a)
		}
	}
}

// observed is the observers to tell, cloned under the lock.
func (s *state) observed() []Observer { return slices.Clone(s.observers) }

package enginepool

import (
	"context"
	"errors"
	"fmt"

	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// A load's owner goroutine, top-down in this file:
//
//	loader.run       the owner of one Loading state
//	  admit          decide.Admit round by round (state.admit): evict, wait for unloads, measure, refuse
//	  startRunner    start the runner under its ceiling and wait until it serves
//	  finish         Ready, or Failed and torn down, or refused (state.load)

// loader brings models in: it is the owner goroutine of each load — admission, the
// runner's start, then Ready or the teardown of a failed start. It holds the runner
// factory and the admission semaphore, and takes the state's lock only through the
// state's methods, never across a start, a wait or a measurement.
type loader struct {
	deps
	st      *state
	factory RunnerFactory
	// admitting serializes admissions (not serving): a one-slot semaphore.
	admitting chan struct{}
	meter     meter
	unloader  unloader
}

// loadJob is one load that route began: its context (canceled by an unload or
// pressure, and at LoadTimeout), its entry and attempt, the spec it loads and the
// state to go back to when it is refused.
type loadJob struct {
	ctx     context.Context
	entry   *entry
	attempt *loadAttempt
	spec    ModelSpec
	prev    State
	gen     uint64
}

// start hands the job to its owner goroutine.
func (l loader) start(job loadJob) {
	go l.run(job)
	signal(l.wake.now)
}

// run is the owner of one Loading state: admission, then the runner, then Ready
// or a teardown.
func (l loader) run(job loadJob) {
	a := job.attempt
	defer a.cancel(context.Canceled)
	ctx, stop := l.clock.withDeadline(job.ctx, l.cfg.LoadTimeout, "loading "+job.spec.Name)
	defer stop()

	g, err := l.admit(ctx, job)
	if err != nil {
		l.finish(ctx, loadStep{kind: loadRefused, job: job, err: err})
		return
	}
	err = l.startRunner(ctx, job, g)
	var fp int64
	if err == nil {
		fp, _ = l.gauge.Process(g.pid)
	}
	l.finish(ctx, loadStep{kind: loadEnded, job: job, eng: g, footprint: fp, err: err})
}

// admit asks decide.Admit, round by round, whether the job's entry may load — evicting
// idle models first, waiting for unloads in progress, or refusing — and on success
// returns the new engine, its reservation committed.
//
// Admissions are serialized (loads wait for each other, serving does not); the
// state's lock is only taken to decide, never across a measurement or an eviction.
func (l loader) admit(ctx context.Context, job loadJob) (*engine, error) {
	spec := job.spec
	// A model that can never fit says so at once, before waiting for other admissions
	// (whose wait a pressure cancel could otherwise turn into insufficient_memory).
	if ceiling := l.st.view(query{}).ceiling; spec.EstimatedBytes > ceiling.Bytes {
		return nil, &ModelTooLargeError{Model: spec.Name, EstimatedBytes: spec.EstimatedBytes, Ceiling: ceiling}
	}
	select {
	case l.admitting <- struct{}{}:
	case <-ctx.Done():
		return nil, l.canceled(ctx, spec.Name)
	}
	defer func() { <-l.admitting }()

	round := admitRound{job: job, req: decide.AdmitRequest{Model: spec.Name, Estimate: spec.EstimatedBytes, Measured: -1}}
	for {
		round.ctx = ctx
		r := l.st.admit(round)
		if r.victim != "" {
			l.log.V(2).Info("Evicting to admit a model", "model", spec.Name, "victim", r.victim,
				"projectedBytes", r.projected, "softBytes", r.softBytes)
			l.unloader.start(r.evict)
		}
		if r.eng != nil || r.err != nil {
			return r.eng, r.err
		}
		if r.wait != nil {
			select {
			case <-r.wait:
			case <-ctx.Done():
				return nil, l.canceled(ctx, spec.Name)
			}
		}
		round.req.Evicted = round.req.Evicted || r.victim != ""
		round.req.Measured = l.meter.footprints()
	}
}

// canceled is the error of an admission that ctx ended: the cancel error of the load
// when someone canceled it, else ctx's cause.
func (l loader) canceled(ctx context.Context, model string) error {
	if err := l.st.view(query{model: model}).cancelErr; err != nil {
		return err
	}
	return fmt.Errorf("admitting %s: %w", model, context.Cause(ctx))
}

// startRunner starts the admitted engine's runner under its ceiling (runnerCeiling),
// records it for measurement, and waits until it serves. The lock is not held
// while starting or waiting.
func (l loader) startRunner(ctx context.Context, job loadJob, g *engine) error {
	runner, err := l.factory.Start(ctx, job.spec, runnerCeiling(g.reservation))
	if err != nil {
		return err
	}
	l.st.load(loadStep{kind: loadStarted, job: job, eng: g, runner: runner})
	signal(l.wake.now) // measure it and push its limits while it loads
	return runner.WaitReady(ctx)
}

// runnerCeiling is the memory ceiling a runner enforces on itself with its prefill
// guard: its reservation plus the 10% tolerance past which the enforcer unloads it. A
// reservation is an estimate, so refusing work at exactly the estimate would refuse
// prompts the enforcer lets run (a small model's runner process alone can be close to
// its estimate).
func runnerCeiling(reservation int64) int64 { return reservation + reservation/10 }

// finish applies the load's end — Ready, Failed, or refused — and does what is left
// outside the lock: the log, the observers, the runner's watcher or the teardown of
// a failed start.
func (l loader) finish(ctx context.Context, step loadStep) {
	a, name := step.job.attempt, step.job.spec.Name
	step.cause = context.Cause(ctx)
	r := l.st.load(step)
	d := l.clock.Since(a.started)
	switch {
	case r.ready:
		l.log.V(2).Info("Model loaded", "model", name, "reservedBytes", step.eng.reservation, "duration", d)
		go l.unloader.watch(step.eng)
		signal(l.wake.now)
	case r.teardown != nil:
		l.log.Info("Model load did not complete", "model", name, "err", r.err.Error())
	default:
		l.log.V(2).Info("Model load refused", "model", name, "err", r.err.Error())
		signal(l.wake.now)
	}
	for _, o := range r.observers {
		o.LoadFinished(LoadEvent{Model: name, Duration: d, Err: a.err})
	}
	if r.teardown != nil {
		l.unloader.teardown(*r.teardown)
	}
}

// admitRound is one round of an admission: the job, what the rounds so far did
// (req), and the admission's context, ended when the load is canceled.
type admitRound struct {
	ctx context.Context
	job loadJob
	req decide.AdmitRequest
}

// admitted is one admission round's outcome: the engine admitted (its reservation
// committed), or a victim (its teardown to start) and a channel to wait on before
// the next round, or the refusal; all nil: measure and ask again.
type admitted struct {
	eng                  *engine
	victim               string
	evict                []teardownJob
	wait                 <-chan struct{}
	err                  error
	projected, softBytes int64
}

// admit decides one admission round (decide.Admit) and applies it.
func (s *state) admit(r admitRound) admitted {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, spec := r.job.entry, r.job.spec
	if r.req.Measured >= 0 && r.ctx.Err() != nil {
		if e.attempt != nil && e.attempt.cancelErr != nil {
			return admitted{err: e.attempt.cancelErr}
		}
		return admitted{err: fmt.Errorf("admitting %s: %w", spec.Name, context.Cause(r.ctx))}
	}
	d := decide.Admit(s.decideSnapshot(), r.req)
	switch d.Kind {
	case decide.AdmitLoad:
		g := newEngine(e, spec, r.job.gen, spec.EstimatedBytes)
		s.committed += spec.EstimatedBytes
		s.activity++
		e.eng = g
		return admitted{eng: g}
	case decide.AdmitEvict:
		r := admitted{victim: d.Victim, projected: d.Projected, softBytes: s.ceiling.SoftBytes}
		var job *teardownJob
		r.wait, job = s.beginUnload(s.entries[d.Victim], ReasonEviction)
		if job != nil {
			r.evict = []teardownJob{*job}
		}
		return r
	case decide.AdmitWait:
		// Unloads already under way will hand their reservations back.
		for g := range s.engines {
			if g.entry != e && g.tearingDown && g.entry.transition != nil {
				return admitted{wait: g.entry.transition}
			}
		}
	case decide.AdmitTooLarge:
		return admitted{err: &ModelTooLargeError{Model: spec.Name, EstimatedBytes: spec.EstimatedBytes, Ceiling: s.ceiling}}
	case decide.AdmitMeasure:
		return admitted{}
	}
	return admitted{err: &InsufficientMemoryError{Model: spec.Name, EstimatedBytes: spec.EstimatedBytes,
		CurrentBytes: d.Current, LimitBytes: d.Limit, Ceiling: s.ceiling, Pressure: s.level,
		Detail: d.Detail, Retry: s.cfg.pausedRetry()}}
}

// loadStepKind names a step of a load.
type loadStepKind int

const (
	// loadStarted: the factory started the runner (not yet ready).
	loadStarted loadStepKind = iota
	// loadEnded: the runner is ready (err nil) or did not come up.
	loadEnded
	// loadRefused: admission refused, or the load was canceled before it had a
	// reservation.
	loadRefused
)

// loadStep is a step of a load to apply: what the process work gave back.
type loadStep struct {
	kind      loadStepKind
	job       loadJob
	eng       *engine
	runner    Runner
	footprint int64
	err       error
	// cause is the load context's cause, for the message of a failed start.
	cause error
}

// loadApplied is what a load step leaves the owner to do: watch a Ready runner, or
// tear down a failed one; tell the observers; err is the load's error.
type loadApplied struct {
	ready     bool
	teardown  *teardownJob
	err       error
	observers []Observer
}

// load applies a step of a load.
func (s *state) load(step loadStep) loadApplied {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, g, a := step.job.entry, step.eng, step.job.attempt
	switch step.kind {
	case loadStarted:
		g.runner, g.pid = step.runner, step.runner.PID()
		if ad, ok := step.runner.(interface{ Adopted() bool }); !ok || !ad.Adopted() {
			g.hotBudget = 0 // a fresh runner starts without a hot tier; an adopted one's is learnt
		}
		s.engines[g] = struct{}{}
		s.activity++
		return loadApplied{}
	case loadRefused:
		s.refused(e, a, step.job.prev, step.err)
	default:
		if step.err == nil && a.cancelReason != "" {
			step.err = a.cancelErr
		}
		if step.err != nil {
			return s.failed(e, g, a, step.err, step.cause)
		}
		now := s.clock.Now()
		g.footprint, g.peak = step.footprint, max(g.peak, step.footprint)
		s.activity++
		g.loadedAt, e.lastUsed = now, now
		e.attempt, e.lastErr, e.failReason = nil, nil, ""
		e.setStable(StateReady)
		close(a.done)
		s.loads++
		return loadApplied{ready: true, observers: s.observed()}
	}
	return loadApplied{err: a.err, observers: s.observed()}
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

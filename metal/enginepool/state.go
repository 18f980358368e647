package enginepool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// state is the pool's shared state and the one owner of its mutex: every field
// below mu, the entries and their engines are guarded by it and touched only by
// state's methods. Each of its ten entry points takes the lock once, reads a view or
// applies a plan (most of them one that package decide returned), and returns what
// the caller must do outside the lock — start or stop a process, wait, measure, tell
// the observers. The helpers they call with the lock held (state's other methods,
// the entry and engine helpers below) never do I/O and never wait.
//
// The lock sites, by what they serve (this file holds the ones a request and its
// load reach, and the helpers they call with the lock held; plans.go the plans'
// types):
//
//	route     a request: decide.RouteRequest, then a lease, a join or a new load
//	view      the small reads: one model, the limits, the runners, a decide.Snapshot
//	admit     one admission round: decide.Admit, then commit, evict, wait or refuse
//	load      a load's steps: its runner started, then Ready, Failed or refused
//	teardown  an unload's steps: drain, stop, settle's bail-out, release; a crash
//	release   a lease's end (lease.go)
//	record    what a measurement or a runner call gave back (measure.go)
//	change    registration, admin unloads, the ceiling, observers, Close and Detach (registry.go)
//	enforce   one enforcer verdict: decide.Enforce, the hot shares, the limits (enforcer.go)
//	snapshot  the public Snapshot (snapshot.go)
type state struct {
	// Set by newState and never changed.
	cfg   Config
	hw    Hardware
	clock ownerClock
	// wake is the enforcer's: loads, unloads and a request on an idle engine wake it.
	wake wakes
	// base is the parent of every load's context; Close and Detach cancel it.
	base context.Context

	mu        sync.Mutex
	ceiling   Ceiling
	entries   map[string]*entry
	aliases   map[string]string
	engines   map[*engine]struct{} // every engine with a runner not yet reaped
	observers []Observer
	closed    bool
	gen       uint64
	committed int64
	// activity counts load starts, loads finished and leases taken; the settle
	// barrier compares it to see whether anything else ran since its pre sample.
	activity uint64
	// The enforcer's last poll.
	usage          int64
	agentBytes     int64
	level          PressureLevel
	overCeilingRun int
	lastPoll       time.Time
	// hotShrunk: hard pressure took every hot tier to zero; they stay there until
	// pressure is ok again.
	hotShrunk bool
	// Counters.
	loads, loadFailures, crashes, unloads, evictions int64
	freedTotal                                       int64
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
		if g.inUse == 1 {
			signal(s.wake.active) // the engine was idle: a poll within PollActive
		}
		return routed{lease: &Lease{st: s, eng: g, model: e.spec.Name, offset: offset}}
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
	signal(s.wake.now)
	return loadJob{ctx: ctx, entry: e, attempt: a, spec: e.spec, prev: prev, gen: s.gen}
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

// view reads what q asks for.
func (s *state) view(q query) view {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := view{ceiling: s.ceiling, level: s.level, usage: s.usage, lastPoll: s.lastPoll, activity: s.activity,
		agentPID: s.cfg.AgentPID, hotBudget: s.hotConfigured()}
	if q.decide {
		v.snap = s.decideSnapshot()
	}
	if q.runners {
		for g := range s.engines {
			if g.runner == nil {
				continue
			}
			ref := runnerRef{g: g, name: g.name, r: g.runner, pid: g.pid}
			ref.status = !isClosed(g.stopped) && (g.spec.PromptCache.Enabled || g.chat == nil || len(g.spec.SplitWorkers) > 0)
			v.runners = append(v.runners, ref)
		}
	}
	e := q.entry
	if e == nil && q.model != "" {
		e = s.lookup(q.model)
	}
	if e == nil {
		return v
	}
	v.known, v.found, v.name, v.state = true, !e.removed, e.spec.Name, e.state
	v.spec, v.lastUnload = e.spec, e.lastUnload
	if g := e.eng; g != nil {
		v.spec = g.spec
		if e.state == StateReady && g.runner != nil && !isClosed(g.stopped) {
			v.runner = g.runner
		}
	}
	if e.attempt != nil {
		v.cancelErr = e.attempt.cancelErr
	}
	return v
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
		signal(s.wake.now) // measure it and push its limits while it loads
		return loadApplied{}
	case loadRefused:
		s.refused(e, a, step.job.prev, step.err)
		signal(s.wake.now)
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
		signal(s.wake.now)
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

// decideSnapshot is the pool as its decisions (package decide) read it.
func (s *state) decideSnapshot() decide.Snapshot {
	return decide.Snapshot{
		Now:       s.clock.Now(),
		Limits:    s.ceiling.limits(),
		Level:     s.level,
		Usage:     s.usage,
		Committed: s.committed,
		Models:    s.decideModels(),
	}
}

// decideModels lists every entry with its current engine.
func (s *state) decideModels() []decide.Model {
	ms := make([]decide.Model, 0, len(s.entries))
	for _, e := range s.entries {
		m := decide.Model{Name: e.spec.Name, State: e.state, Pinned: e.spec.Residency == Pinned,
			IdleTimeout: e.idleTimeout(s.cfg.IdleTimeout), LastUsed: e.lastUsed}
		if g := e.eng; g != nil {
			_, running := s.engines[g]
			m.Engine = &decide.Engine{Running: running, TearingDown: g.tearingDown, InUse: g.inUse,
				Footprint: g.footprint, Reservation: g.reservation, OwnCeiling: g.ownCeiling(),
				OverCeiling: g.overCeiling}
		}
		ms = append(ms, m)
	}
	return ms
}

// observed is the observers to tell, cloned under the lock.
func (s *state) observed() []Observer { return slices.Clone(s.observers) }

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

// limits are the ceiling's bytes and watermarks.
func (c Ceiling) limits() decide.Limits {
	return decide.Limits{Ceiling: c.Bytes, Soft: c.SoftBytes, Hard: c.HardBytes}
}

func newEngine(e *entry, spec ModelSpec, gen uint64, reservation int64) *engine {
	return &engine{
		entry:        e,
		name:         spec.Name,
		gen:          gen,
		spec:         spec,
		reservation:  reservation,
		startCeiling: runnerCeiling(reservation),
		stopped:      make(chan struct{}),
		hotBudget:    -1,
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

func (e *entry) idleTimeout(def time.Duration) time.Duration {
	if e.spec.Residency != OnDemand && e.spec.Residency != "" {
		return 0
	}
	if e.spec.IdleTimeout > 0 {
		return e.spec.IdleTimeout
	}
	return def
}

// hotConfigured is the hot budget as configured: Config.PromptCacheHotBytes, or
// DefaultPromptCacheHotFraction of the ceiling.
func (s *state) hotConfigured() int64 {
	b := s.cfg.PromptCacheHotBytes
	switch {
	case b < 0:
		return 0
	case b == 0:
		return int64(float64(s.ceiling.Bytes) * DefaultPromptCacheHotFraction)
	}
	return b
}

// ownCeiling is the ceiling a runner enforces on itself and past which the enforcer
// treats it as over its ceiling: its reservation plus the 10% tolerance, plus the
// hot-tier budget it holds.
func (g *engine) ownCeiling() int64 {
	return runnerCeiling(g.reservation) + max(g.hotBudget, g.hotShare, 0)
}

// runnerCeiling is the memory ceiling a runner enforces on itself with its prefill
// guard: its reservation plus the 10% tolerance past which the enforcer unloads it. A
// reservation is an estimate, so refusing work at exactly the estimate would refuse
// prompts the enforcer lets run (a small model's runner process alone can be close to
// its estimate).
func runnerCeiling(reservation int64) int64 { return reservation + reservation/10 }

// graceful reasons wait the long drain deadline; pressure reasons the short one.
func (r UnloadReason) graceful() bool {
	switch r {
	case ReasonPressure, ReasonOverCeiling:
		return false
	}
	return true
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

// backoff is the wait before the next load after failures consecutive failures.
func (c Config) backoff(failures int) time.Duration {
	d := c.BackoffInitial
	for i := 1; i < failures && d < c.BackoffMax; i++ {
		d *= 2
	}
	return min(d, c.BackoffMax)
}

// pausedRetry is the retry hint of a refused load.
func (c Config) pausedRetry() time.Duration { return 5 * c.PollActive }

func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// signal is a non-blocking send on a one-slot wake channel.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

package enginepool

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// A model's way in: the request's route, the load it starts, and the state's steps
// that load takes. A Loading state has one owner, loader.run, which takes the state's
// lock only through the state's methods — one step, one plan — never across a start,
// a wait or a measurement:
//
//	Acquire            a lease on a Ready engine, loading the model first if it must
//	  state.route      under the lock: decide.RouteRequest, then a lease, a join or a
//	                   new load (beginLoad)
//	  loader.start     a new load goes to its owner goroutine, loader.run, under
//	                   LoadTimeout on the injected clock (ownerClock)
//	    admit          decide.Admit round by round (state.admit): evict (unload.go),
//	                   wait, measure (measure.go), refuse
//	    startRunner    start the runner under its ceiling and wait until it serves
//	    finish         Ready, or Failed and torn down (unload.go), or refused (state.load)
//	  await            wait for the load, bounded by the request's context
//
// The request then holds its Lease (lease.go: Runner, Release), and the agent checks
// the prompt against memory with CheckPrefill (prefill.go) before the first byte. The
// state's reads that these steps decide on (view, decideSnapshot) are here too.
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

// beginLoad moves e to Loading with a new attempt, whose owner goroutine the
// returned job starts: it drives e to Ready, Failed or back to a stable unloaded
// state under LoadTimeout.
func (s *state) beginLoad(e *entry) loadJob {
	ctx, cancel := context.WithCancelCause(s.base)
	a := &loadAttempt{done: make(chan struct{}), cancel: cancel, started: s.clock.Now()}
	prev := e.state
	// A load starts from a stable state, whose transition is nil: it opens one.
	e.attempt, e.state, e.transition = a, StateLoading, make(chan struct{})
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

// start hands the job to its owner goroutine.
func (l loader) start(job loadJob) {
	go l.run(job)
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
	step := loadStep{kind: loadEnded, job: job, eng: g, err: err}
	if err == nil {
		step.footprint, _ = l.gauge.Process(g.pid)
		if st, serr := g.runner.Status(ctx); serr == nil {
			step.deviceSeparate = st.DeviceMemorySeparate
		}
	}
	l.finish(ctx, step)
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

	round := admitRound{ctx: ctx, job: job, req: decide.AdmitRequest{Model: spec.Name, Estimate: spec.EstimatedBytes, Measured: -1}}
	for {
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
	runner, err := l.factory.Start(ctx, job.spec, g.startCeiling)
	if err != nil {
		return err
	}
	l.st.load(loadStep{kind: loadStarted, job: job, eng: g, runner: runner})
	return runner.WaitReady(ctx)
}

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
	case r.teardown != nil:
		l.log.Info("Model load did not complete", "model", name, "err", r.err.Error())
	default:
		l.log.V(2).Info("Model load refused", "model", name, "err", r.err.Error())
	}
	for _, o := range r.observers {
		o.LoadFinished(LoadEvent{Model: name, Duration: d, Err: a.err})
	}
	if r.teardown != nil {
		l.unloader.teardown(*r.teardown)
	}
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

// runnerCeiling is the memory ceiling a runner enforces on itself with its prefill
// guard: its reservation plus the 10% tolerance past which the enforcer unloads it. A
// reservation is an estimate, so refusing work at exactly the estimate would refuse
// prompts the enforcer lets run (a small model's runner process alone can be close to
// its estimate).
func runnerCeiling(reservation int64) int64 { return reservation + reservation/10 }

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
	default:
		if step.err == nil && a.cancelReason != "" {
			step.err = a.cancelErr
		}
		if step.err != nil {
			return s.failed(e, g, a, step.err, step.cause)
		}
		now := s.clock.Now()
		g.footprint, g.peak = step.footprint, max(g.peak, step.footprint)
		if step.deviceSeparate {
			g.runtimeBytes = step.footprint
		}
		s.activity++
		g.loadedAt, e.lastUsed = now, now
		e.attempt, e.lastErr, e.failReason = nil, nil, ""
		e.setStable(StateReady)
		close(a.done)
		s.loads++
	}
	signal(s.wake.now)
	// a.err is what the load's waiters get: nil when Ready.
	return loadApplied{ready: step.kind != loadRefused, err: a.err, observers: s.observed()}
}

// pausedRetry is the retry hint of a refused load.
func (c Config) pausedRetry() time.Duration { return 5 * c.PollActive }

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
				Footprint: g.footprint, Reservation: g.reservation, OwnCeiling: g.hostCeiling(),
				OverCeiling: g.overCeiling}
		}
		ms = append(ms, m)
	}
	return ms
}

// limits are the ceiling's bytes and watermarks.
func (c Ceiling) limits() decide.Limits {
	return decide.Limits{Ceiling: c.Bytes, Soft: c.SoftBytes, Hard: c.HardBytes}
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

// ownCeiling is the ceiling a runner enforces on itself and past which the enforcer
// treats it as over its ceiling: its reservation plus the 10% tolerance, plus the
// hot-tier budget it holds.
func (g *engine) ownCeiling() int64 {
	return runnerCeiling(g.reservation) + max(g.hotBudget, g.hotShare, 0)
}

// hostCeiling is the footprint past which the enforcer treats the runner as over its
// ceiling: its own ceiling, plus the runtime's host memory where the model lives on
// a card with memory of its own. There the reservation (the model's estimate) is
// on the card, and the host holds the accelerator runtime: 400-500 MiB of a CUDA
// context and its libraries whatever the model's size, which the estimate does not
// count. Without it every model smaller than its runtime was unloaded as over its
// ceiling on its first poll. The runner itself is told ownCeiling: on such a card its
// guard bounds the device allocation, which the runtime's host memory is not part of.
func (g *engine) hostCeiling() int64 {
	return g.ownCeiling() + g.runtimeBytes
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

// ownerClock is the pool's injected clock with the deadlines and bounded waits of
// the owner goroutines on it, so that they follow a fake clock in tests (waitFor, the
// unloader's bounded wait, is in unload.go).
type ownerClock struct{ clock.WithTicker }

// withDeadline derives a context that the clock cancels after d.
func (c ownerClock) withDeadline(parent context.Context, d time.Duration, what string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	t := c.NewTimer(d)
	go func() {
		select {
		case <-t.C():
			cancel(fmt.Errorf("%s: deadline of %s exceeded: %w", what, d, context.DeadlineExceeded))
		case <-ctx.Done():
			t.Stop()
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// goCall runs call in a goroutine of wg, with a context the clock cancels after d:
// one runner call of a batch that the caller waits for (what names the call in the
// deadline's error).
func (c ownerClock) goCall(wg *sync.WaitGroup, d time.Duration, what string, call func(ctx context.Context)) {
	wg.Go(func() {
		ctx, cancel := c.withDeadline(context.Background(), d, what)
		defer cancel()
		call(ctx)
	})
}

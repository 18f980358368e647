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
// state's methods. Each exported-to-the-package method takes the lock once, reads a
// snapshot or applies a plan (most of them one that package decide returned), and
// returns what the caller must do outside the lock — start or stop a process, wait,
// measure, tell the observers. The methods it calls with the lock held are unexported
// helpers of the same type; none of them does I/O or waits.
//
// The lock sites, by what they serve:
//
//	route     a request: decide.RouteRequest, then a lease, a join or a new load (acquire.go)
//	release   a lease's end (lease.go)
//	view      the small reads: one model, the limits, the runners, a decide.Snapshot
//	change    registration, admin unloads, the ceiling, observers, Close and Detach
//	admit     one admission round: decide.Admit, then commit, evict, wait or refuse (load.go)
//	load      a load's steps: its runner started, then Ready, Failed or refused (load.go)
//	teardown  an unload's steps: drain, stop, release; a crash (unload.go)
//	enforce   one enforcer verdict: decide.Enforce, the hot shares, the limits (enforcer.go)
//	record    what a measurement or a runner call gave back (measure.go)
//	snapshot  the public Snapshot (snapshot.go)
type state struct {
	// Set by newState and never changed.
	cfg   Config
	hw    Hardware
	clock ownerClock
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

func newState(cfg Config, hw Hardware, clk ownerClock, base context.Context) *state {
	return &state{
		cfg: cfg, hw: hw, clock: clk, base: base,
		ceiling: ComputeCeiling(hw, cfg.CeilingBytes, cfg.ReserveBytes, cfg.SoftFraction, cfg.HardFraction),
		entries: map[string]*entry{},
		aliases: map[string]string{},
		engines: map[*engine]struct{}{},
		level:   PressureOK,
	}
}

// query says what a view reads besides the limits.
type query struct {
	// model (a name or alias) or entry: the entry to read.
	model string
	entry *entry
	// decide asks for a decide.Snapshot; runners for the live runners.
	decide, runners bool
}

// view is what the small reads need, read under one lock.
type view struct {
	ceiling   Ceiling
	level     PressureLevel
	usage     int64
	lastPoll  time.Time
	activity  uint64
	agentPID  int
	snap      decide.Snapshot
	runners   []runnerRef
	hotBudget int64 // as configured
	// The asked entry: found (and not removed), its spec (the loaded engine's when
	// it has one), its Ready runner, its last unload and its load's cancel error.
	found, known bool
	name         string
	spec         ModelSpec
	state        State
	runner       Runner
	lastUnload   *UnloadReport
	cancelErr    error
}

// runnerRef is one live runner, for the calls made to every runner.
type runnerRef struct {
	g    *engine
	name string
	r    Runner
	pid  int
	// status: the poll reads its status (a prompt cache, a split head, or a chat
	// rendering not yet known).
	status bool
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

// changeKind names what a change does.
type changeKind int

const (
	changeRegister changeKind = iota
	changeUpdate
	changeRemove
	changeRetire
	changeUnload // admin
	changeCeiling
	changeObserver
	changeClose
	changeDetach
)

// change is one change of the pool's tables from outside: the registry, an admin
// unload, the configured ceiling, an observer, the end of the pool.
type change struct {
	kind     changeKind
	model    string
	spec     ModelSpec
	ceiling  int64
	observer Observer
}

// changed is what a change leaves the caller to do: start jobs, wait on done or waits.
type changed struct {
	entry      *entry
	done       <-chan struct{}
	waits      []<-chan struct{}
	jobs       []teardownJob
	lastUnload *UnloadReport
	ceiling    Ceiling
	// detached are the engines Detach let go of, still running.
	detached []*engine
	err      error
}

// change applies c.
func (s *state) change(c change) changed {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out changed
	switch c.kind {
	case changeRegister, changeUpdate:
		out.err = s.register(c.kind, c.spec)
	case changeCeiling:
		s.ceiling = ComputeCeiling(s.hw, c.ceiling, s.cfg.ReserveBytes, s.cfg.SoftFraction, s.cfg.HardFraction)
		out.ceiling = s.ceiling
	case changeObserver:
		s.observers = append(s.observers, c.observer)
	case changeClose, changeDetach:
		s.closed = true
		for _, e := range s.entries {
			if g := s.detach(e, c.kind); g != nil {
				out.detached = append(out.detached, g)
				continue
			}
			if e.state == StateReady || e.state.Transient() {
				out.add(s.beginUnload(e, ReasonShutdown))
			}
		}
	default:
		out = s.unregister(c)
	}
	return out
}

// add takes one unload's channel and job.
func (c *changed) add(done <-chan struct{}, job *teardownJob) {
	c.done = done
	c.waits = append(c.waits, done)
	if job != nil {
		c.jobs = append(c.jobs, *job)
	}
}

// register is Register (a new entry) and Update (a known one).
func (s *state) register(kind changeKind, spec ModelSpec) error {
	e := s.entries[spec.Name]
	if kind == changeUpdate {
		if e == nil || e.removed {
			return &UnknownModelError{Model: spec.Name}
		}
		return s.setSpec(e, spec)
	}
	if s.closed {
		return errors.New("enginepool: pool is closed")
	}
	if e != nil && !e.removed {
		return fmt.Errorf("model %q is already registered", spec.Name)
	}
	if err := s.setSpec(e, spec); err != nil {
		return err
	}
	if e != nil {
		// Re-registered while its engine was still stopping: the entry (and the engine
		// it owns) is kept, the removal canceled, and the spec applies at the next load.
		e.removed, e.retired = false, false
	}
	return nil
}

// unregister is Remove, Retire and an admin unload of a known model.
func (s *state) unregister(c change) changed {
	e := s.lookup(c.model)
	if e == nil || e.removed {
		return changed{err: &UnknownModelError{Model: c.model}}
	}
	out := changed{entry: e, lastUnload: e.lastUnload}
	reason := ReasonAdmin
	switch c.kind {
	case changeRemove:
		e.removed, reason = true, ReasonRemoved
		if !e.state.Transient() && e.state != StateReady {
			s.deleteEntry(e)
			out.done = closedChan()
			return out
		}
	case changeRetire:
		e.retired, reason = true, ReasonRetired
	}
	out.add(s.beginUnload(e, reason))
	return out
}

// detach lets go of e's Ready runner when the pool is detaching and the runner can
// outlive it (Detacher), and returns its engine; nil when it did not.
func (s *state) detach(e *entry, kind changeKind) *engine {
	g := e.eng
	if kind != changeDetach || e.state != StateReady || g == nil || g.tearingDown {
		return nil
	}
	// Detach only closes idle connections and ends watchers: no I/O to wait on.
	d, ok := g.runner.(Detacher)
	if !ok || !d.Detach() {
		return nil
	}
	g.tearingDown = true // the crash watcher must not report it
	g.invalidate(&UnavailableError{Model: g.name, State: StateStopping, ErrCode: CodePoolClosed,
		Reason: "the node agent is shutting down", Retry: s.cfg.RetryAfter})
	s.committed -= g.reservation
	delete(s.engines, g)
	e.eng = nil
	e.setStable(StateUnloaded)
	return g
}

// setSpec is what Register and Update share: it makes spec the desired spec of e (a
// new entry when e is nil) and moves the alias table from e's old aliases to spec's,
// refusing — before it changes anything — an alias that is another model's name or
// alias, or a name that is another model's alias. The engine e owns keeps the spec it
// was started with (engine.spec).
func (s *state) setSpec(e *entry, spec ModelSpec) error {
	for _, a := range spec.Aliases {
		if a == spec.Name {
			continue
		}
		if _, ok := s.entries[a]; ok {
			return fmt.Errorf("alias %q of model %q is the name of another model", a, spec.Name)
		}
		if owner, ok := s.aliases[a]; ok && owner != spec.Name {
			return fmt.Errorf("alias %q of model %q is already an alias of %q", a, spec.Name, owner)
		}
	}
	if owner, ok := s.aliases[spec.Name]; ok && owner != spec.Name {
		return fmt.Errorf("model name %q is already an alias of %q", spec.Name, owner)
	}
	if e == nil {
		e = &entry{state: StateAbsent}
		s.entries[spec.Name] = e
	}
	for _, a := range e.spec.Aliases {
		if s.aliases[a] == spec.Name {
			delete(s.aliases, a)
		}
	}
	e.spec = spec
	for _, a := range spec.Aliases {
		if a != spec.Name {
			s.aliases[a] = spec.Name
		}
	}
	return nil
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

// limits are the ceiling's bytes and watermarks.
func (c Ceiling) limits() decide.Limits {
	return decide.Limits{Ceiling: c.Bytes, Soft: c.SoftBytes, Hard: c.HardBytes}
}

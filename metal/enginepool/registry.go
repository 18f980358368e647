package enginepool

import (
	"errors"
	"fmt"
)

// The pool's tables changed from outside — Register, Update, Remove, Retire, admin
// unloads, the configured ceiling, observers, Close and Detach — under one lock
// site, state.change.

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

package metal

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// admit decides whether e may load with spec, evicting idle models first, and on
// success commits the reservation and returns the new engine (e.eng). It is the
// algorithm of ENGINE_POOL.md:
//
//	current   = max(measured pool footprint, committed reservations)
//	projected = current + estimate
//	while projected > soft target and an evictable victim exists: unload it, re-measure
//	admit if projected <= ceiling
//
// Admissions are serialized (loads wait for each other, serving does not); the pool
// mutex is only taken to decide, never across a measurement or an eviction.
func (p *Pool) admit(ctx context.Context, e *entry, spec ModelSpec, gen uint64) (*engine, error) {
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
		return nil, p.ctxLoadError(ctx, spec.Name)
	}
	defer func() { <-p.admitting }()

	est := spec.EstimatedBytes
	p.mu.Lock()
	ceiling, level := p.ceiling, p.level
	if est > ceiling.Bytes {
		p.mu.Unlock()
		return nil, &ModelTooLargeError{Model: spec.Name, EstimatedBytes: est, Ceiling: ceiling}
	}
	if level.atLeast(PressureHard) {
		err := p.insufficientLocked(e, spec, max(p.usage, p.committed), ceiling.SoftBytes,
			fmt.Sprintf("loads are paused under %s memory pressure", level))
		p.mu.Unlock()
		return nil, err
	}
	p.mu.Unlock()

	evicted := false
	for {
		measured := p.measurePool()
		p.mu.Lock()
		if ctx.Err() != nil {
			p.mu.Unlock()
			return nil, p.ctxLoadError(ctx, spec.Name)
		}
		ceiling, level = p.ceiling, p.level
		if est > ceiling.Bytes { // the ceiling may have been lowered meanwhile
			p.mu.Unlock()
			return nil, &ModelTooLargeError{Model: spec.Name, EstimatedBytes: est, Ceiling: ceiling}
		}
		current := max(measured, p.committed)
		if evicted {
			// Gauges may still show the victims' residue: trust the reservations.
			current = p.committed
		}
		projected := current + est
		limit, detail := ceiling.Bytes, ""
		if level.atLeast(PressureSoft) {
			limit, detail = ceiling.SoftBytes, fmt.Sprintf("loads are paused above the soft watermark under %s memory pressure", level)
		}

		var wait <-chan struct{}
		if projected > ceiling.SoftBytes {
			if v := p.pickVictimLocked(e, projected-ceiling.SoftBytes); v != nil {
				p.log.V(2).Info("Evicting to admit a model", "model", spec.Name, "victim", v.spec.Name,
					"projectedBytes", projected, "softBytes", ceiling.SoftBytes)
				wait = p.startUnloadLocked(v, ReasonEviction)
				evicted = true
			}
		}
		if wait == nil && projected > limit {
			// Unloads already under way will hand their reservations back: wait for
			// them rather than refusing a load that fits once they are done.
			if pending, ch := p.pendingReleaseLocked(e); pending > 0 && projected-pending <= limit {
				wait = ch
			}
		}
		if wait == nil {
			if projected > limit {
				err := p.insufficientLocked(e, spec, current, limit, detail)
				p.mu.Unlock()
				return nil, err
			}
			g := newEngine(e, spec, gen, est)
			p.committed += est
			p.activity++
			e.eng = g
			p.mu.Unlock()
			return g, nil
		}
		p.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, p.ctxLoadError(ctx, spec.Name)
		}
	}
}

// pendingReleaseLocked sums the reservations of engines being torn down and returns
// the transition of one of them to wait for.
func (p *Pool) pendingReleaseLocked(self *entry) (int64, <-chan struct{}) {
	var sum int64
	var ch <-chan struct{}
	for g := range p.engines {
		if g.entry == self || !g.tearingDown {
			continue
		}
		sum += g.reservation
		if ch == nil && g.entry.transition != nil {
			ch = g.entry.transition
		}
	}
	if ch == nil {
		return 0, nil
	}
	return sum, ch
}

func (p *Pool) insufficientLocked(self *entry, spec ModelSpec, current, limit int64, detail string) error {
	var blockers []string
	for _, e := range p.entries {
		if e == self || e.eng == nil {
			continue
		}
		switch {
		case e.state == StateReady && e.spec.Residency == Pinned:
			blockers = append(blockers, e.spec.Name+" (pinned)")
		case e.state == StateReady && e.eng.inUse > 0:
			blockers = append(blockers, e.spec.Name+" (busy)")
		case e.state == StateLoading:
			blockers = append(blockers, e.spec.Name+" (loading)")
		case e.state == StateDraining || e.state == StateStopping:
			blockers = append(blockers, e.spec.Name+" (unloading)")
		}
	}
	slices.Sort(blockers)
	if len(blockers) > 0 {
		held := "memory is held by " + strings.Join(blockers, ", ")
		if detail == "" {
			detail = held
		} else {
			detail += "; " + held
		}
	}
	return &InsufficientMemoryError{Model: spec.Name, EstimatedBytes: spec.EstimatedBytes,
		CurrentBytes: current, LimitBytes: limit, Ceiling: p.ceiling, Pressure: p.level,
		Detail: detail, Retry: p.pausedRetry()}
}

// pausedRetry is the retry hint of a refused load.
func (p *Pool) pausedRetry() time.Duration { return 5 * p.cfg.PollActive }

func (p *Pool) ctxLoadError(ctx context.Context, model string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.lookupLocked(model); e != nil && e.attempt != nil && e.attempt.cancelErr != nil {
		return e.attempt.cancelErr
	}
	return fmt.Errorf("admitting %s: %w", model, context.Cause(ctx))
}

// measurePool measures every runner from outside and the agent itself, stores the
// figures, and returns their sum (the measured pool footprint). No lock is held
// while measuring.
func (p *Pool) measurePool() int64 {
	type target struct {
		g   *engine
		pid int
	}
	p.mu.Lock()
	targets := make([]target, 0, len(p.engines))
	for g := range p.engines {
		if g.pid > 0 {
			targets = append(targets, target{g, g.pid})
		}
	}
	agentPID := p.cfg.AgentPID
	p.mu.Unlock()

	fps := make([]int64, len(targets))
	ok := make([]bool, len(targets))
	for i, t := range targets {
		if fp, err := p.gauge.Process(t.pid); err == nil {
			fps[i], ok[i] = fp, true
		}
	}
	var agent int64
	if agentPID > 0 {
		if fp, err := p.gauge.Process(agentPID); err == nil {
			agent = fp
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	sum := agent
	for i, t := range targets {
		switch {
		case ok[i]:
			t.g.footprint = fps[i]
			t.g.peak = max(t.g.peak, fps[i])
		case t.g.tearingDown:
			continue // being stopped and gone: its memory is on its way back
		}
		sum += t.g.footprint
	}
	p.agentBytes = agent
	return sum
}

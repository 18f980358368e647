package enginepool

import (
	"context"
	"fmt"
	"time"

	"github.com/macfleet/macfleet/enginepool/decide"
)

// admit asks decide.Admit, round by round, whether e may load with spec — evicting
// idle models first, waiting for unloads in progress, or refusing — and on success
// commits the reservation and returns the new engine (e.eng).
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

	req := decide.AdmitRequest{Model: spec.Name, Estimate: spec.EstimatedBytes, Measured: -1}
	for {
		p.mu.Lock()
		if req.Measured >= 0 && ctx.Err() != nil {
			p.mu.Unlock()
			return nil, p.ctxLoadError(ctx, spec.Name)
		}
		d := decide.Admit(p.decideSnapshotLocked(), req)
		g, wait, err := p.applyAdmissionLocked(e, spec, gen, d)
		p.mu.Unlock()
		if g != nil || err != nil {
			return g, err
		}
		if wait != nil {
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, p.ctxLoadError(ctx, spec.Name)
			}
		}
		req.Evicted = req.Evicted || d.Kind == decide.AdmitEvict
		req.Measured = p.measurePool()
	}
}

// applyAdmissionLocked applies one admission round: the engine admitted, or a channel
// to wait on before the next round, or the refusal; all nil: measure and ask again.
func (p *Pool) applyAdmissionLocked(e *entry, spec ModelSpec, gen uint64, d decide.Admission) (*engine, <-chan struct{}, error) {
	switch d.Kind {
	case decide.AdmitLoad:
		g := newEngine(e, spec, gen, spec.EstimatedBytes)
		p.committed += spec.EstimatedBytes
		p.activity++
		e.eng = g
		return g, nil, nil
	case decide.AdmitEvict:
		p.log.V(2).Info("Evicting to admit a model", "model", spec.Name, "victim", d.Victim,
			"projectedBytes", d.Projected, "softBytes", p.ceiling.SoftBytes)
		return nil, p.startUnloadLocked(p.entries[d.Victim], ReasonEviction), nil
	case decide.AdmitWait:
		// Unloads already under way will hand their reservations back.
		if ch := p.releasingLocked(e); ch != nil {
			return nil, ch, nil
		}
	case decide.AdmitTooLarge:
		return nil, nil, &ModelTooLargeError{Model: spec.Name, EstimatedBytes: spec.EstimatedBytes, Ceiling: p.ceiling}
	case decide.AdmitMeasure:
		return nil, nil, nil
	}
	return nil, nil, &InsufficientMemoryError{Model: spec.Name, EstimatedBytes: spec.EstimatedBytes,
		CurrentBytes: d.Current, LimitBytes: d.Limit, Ceiling: p.ceiling, Pressure: p.level,
		Detail: d.Detail, Retry: p.pausedRetry()}
}

// releasingLocked is the transition of an engine being torn down (other than self's)
// to wait for, or nil.
func (p *Pool) releasingLocked(self *entry) <-chan struct{} {
	for g := range p.engines {
		if g.entry != self && g.tearingDown && g.entry.transition != nil {
			return g.entry.transition
		}
	}
	return nil
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

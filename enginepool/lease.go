package enginepool

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Lease is one request's hold on one engine, from routing to its last byte (for a
// stream: until the goroutine writing it has returned). While any lease on an engine
// is held, no eviction, idle expiry or pressure action picks that engine, and a
// draining unload waits for it. Release it exactly when the request is over; Release
// is idempotent and never takes a count below zero.
type Lease struct {
	pool     *Pool
	eng      *engine
	model    string
	acquired time.Time
	released bool // guarded by pool.mu
	cold     bool
}

// Model is the served name of the leased model.
func (l *Lease) Model() string { return l.model }

// ColdStart reports whether Acquire waited for the model to load.
func (l *Lease) ColdStart() bool { return l.cold }

// Spec is the spec the leased engine was started with.
func (l *Lease) Spec() ModelSpec { return l.eng.spec }

// Runner is the engine to proxy to (Client and BaseURL). Once the engine is stopping,
// has crashed, or the lease was released, it returns an *UnavailableError instead of
// a dead engine.
func (l *Lease) Runner() (Runner, error) {
	select {
	case <-l.eng.stopped:
		return nil, l.eng.stopErr
	default:
	}
	l.pool.mu.Lock()
	released := l.released
	l.pool.mu.Unlock()
	if released {
		return nil, &UnavailableError{Model: l.model, State: StateReady, ErrCode: CodeEngineStopped,
			Reason: "the lease was already released", Retry: l.pool.cfg.RetryAfter}
	}
	return l.eng.runner, nil
}

// Done is closed when the engine stops or crashes under the lease; the request
// should then end with Err.
func (l *Lease) Done() <-chan struct{} { return l.eng.stopped }

// Err says why Done was closed (nil while it is open).
func (l *Lease) Err() error {
	select {
	case <-l.eng.stopped:
		return l.eng.stopErr
	default:
		return nil
	}
}

// Release ends the lease. It restarts the model's idle clock.
func (l *Lease) Release() {
	p := l.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.released {
		return
	}
	l.released = true
	g := l.eng
	if g.inUse > 0 {
		g.inUse--
		if g.inUse == 0 && g.released != nil {
			close(g.released)
			g.released = nil
		}
	}
	if e := g.entry; e.eng == g {
		e.lastUsed = p.clock.Now()
	}
}

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
		l, a, err := p.tryAcquire(model)
		if l != nil {
			l.cold = cold
		}
		if l != nil || err != nil {
			return l, err
		}
		cold = true
		if err := p.awaitLoad(ctx, model, a); err != nil {
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

// tryAcquire leases a Ready engine, or returns the load attempt to wait for.
func (p *Pool) tryAcquire(model string) (*Lease, *loadAttempt, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, &UnavailableError{Model: model, State: StateStopping, ErrCode: CodePoolClosed,
			Reason: "the node agent is shutting down", Retry: p.cfg.RetryAfter}
	}
	e := p.lookupLocked(model)
	if e == nil || e.removed {
		return nil, nil, &UnknownModelError{Model: model}
	}
	if e.retired {
		// The same answer as while draining: a gateway retries elsewhere.
		return nil, nil, &UnavailableError{Model: e.spec.Name, State: e.state, ErrCode: CodeModelDraining,
			Reason: "the model is being removed from this node", Retry: p.cfg.RetryAfter}
	}
	now := p.clock.Now()
	switch e.state {
	case StateReady:
		return p.leaseLocked(e, now), nil, nil
	case StateLoading:
		return nil, e.attempt, nil
	case StateDraining, StateStopping:
		return nil, nil, &UnavailableError{Model: e.spec.Name, State: e.state, ErrCode: CodeModelDraining,
			Reason: "the model is being unloaded", Retry: p.cfg.RetryAfter}
	case StateFailed:
		if now.Before(e.retryAt) {
			return nil, nil, &UnavailableError{Model: e.spec.Name, State: e.state, ErrCode: CodeModelLoadFailed,
				Reason: e.failReason, Retry: e.retryAt.Sub(now), Err: e.lastErr}
		}
	}
	return nil, p.startLoadLocked(e), nil
}

func (p *Pool) leaseLocked(e *entry, now time.Time) *Lease {
	g := e.eng
	g.inUse++
	g.requests++
	p.activity++
	e.lastUsed = now
	if g.inUse == 1 {
		p.signal(p.wakeActive)
	}
	return &Lease{pool: p, eng: g, model: e.spec.Name, acquired: now}
}

func (p *Pool) awaitLoad(ctx context.Context, model string, a *loadAttempt) error {
	select {
	case <-a.done:
		return a.err
	case <-ctx.Done():
		return &UnavailableError{Model: model, State: StateLoading, ErrCode: CodeModelLoading,
			Reason: "the model is still loading", Retry: p.cfg.RetryAfter, Err: context.Cause(ctx)}
	}
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

// IsEngineStopped reports whether err says a lease's engine went away under it.
func IsEngineStopped(err error) bool {
	var ue *UnavailableError
	return errors.As(err, &ue) && ue.ErrCode == CodeEngineStopped
}

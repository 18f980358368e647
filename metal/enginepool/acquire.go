package enginepool

import (
	"context"
	"time"
)

// One request's way through the pool:
//
//	Acquire         a lease on a Ready engine, loading the model first if it must
//	  state.route   under the lock: decide.RouteRequest, then a lease, a join or a
//	                new load (state.go)
//	  loader.start  a new load goes to its owner goroutine (owners.go)
//	  await         wait for the load, bounded by the request's context
//
// The request then holds its Lease (lease.go: Runner, Release), and the agent checks
// the prompt against memory with CheckPrefill (prefill.go) before the first byte.
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

package enginepool

import (
	"errors"
	"sync/atomic"
)

// Lease is one request's hold on one engine, from routing to its last byte (for a
// stream: until the goroutine writing it has returned). While any lease on an engine
// is held, no eviction, idle expiry or pressure action picks that engine, and a
// draining unload waits for it. Release it exactly when the request is over; Release
// is idempotent and never takes a count below zero.
type Lease struct {
	st    *state
	eng   *engine
	model string
	// offset is when the lease was taken, as nanoseconds since the engine's loadedAt
	// (engine.activeNanos).
	offset int64
	// released is set once, by state.release.
	released atomic.Bool
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
	if l.released.Load() {
		return nil, &UnavailableError{Model: l.model, State: StateReady, ErrCode: CodeEngineStopped,
			Reason: "the lease was already released", Retry: l.st.cfg.RetryAfter}
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
func (l *Lease) Release() { l.st.release(l) }

// release takes l's count back out of its engine, once: the lease's time goes into
// the engine's lease seconds, a drain waiting for the last lease is woken, and the
// entry's idle clock restarts.
func (s *state) release(l *Lease) {
	if l.released.Swap(true) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := l.eng
	now := s.clock.Now()
	if g.inUse > 0 {
		g.inUse--
		g.activeNanos -= l.offset
		g.heldNanos += int64(now.Sub(g.loadedAt)) - l.offset
		if g.inUse == 0 && g.released != nil {
			close(g.released)
			g.released = nil
		}
	}
	if e := g.entry; e.eng == g {
		e.lastUsed = now
	}
}

// IsEngineStopped reports whether err says a lease's engine went away under it.
func IsEngineStopped(err error) bool {
	var ue *UnavailableError
	return errors.As(err, &ue) && ue.ErrCode == CodeEngineStopped
}

package enginepool

import (
	"context"
	"fmt"
	"time"
)

// The owner goroutines' tools: the wake channels they signal, the deadlines of their
// transient states (on the injected clock) and the failure backoff.

// signal is a non-blocking send on a one-slot channel.
func (p *Pool) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// withDeadline derives a context that the injected clock cancels after d, so
// deadlines of transient states follow a fake clock in tests.
func (p *Pool) withDeadline(parent context.Context, d time.Duration, what string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	t := p.clock.NewTimer(d)
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

// waitFor waits for ch up to d on the injected clock. It reports whether ch closed.
func (p *Pool) waitFor(ch <-chan struct{}, d time.Duration) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
	}
	if d <= 0 {
		return false
	}
	t := p.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C():
		return false
	}
}

func (p *Pool) backoff(failures int) time.Duration {
	d := p.cfg.BackoffInitial
	for i := 1; i < failures && d < p.cfg.BackoffMax; i++ {
		d *= 2
	}
	return min(d, p.cfg.BackoffMax)
}

func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

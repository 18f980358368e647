package enginepool

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// The owner goroutines' tools: the wake channels they signal, the deadlines of their
// transient states (on the injected clock) and the failure backoff.

// deps is what every effect of the pool works with besides the state: the config,
// the injected clock, the log, the memory gauge and the enforcer's wake channels.
type deps struct {
	cfg   Config
	clock ownerClock
	log   logr.Logger
	gauge Gauge
	wake  wakes
}

// wakes are the enforcer's wake channels: now asks for a poll at once, active for
// one within PollActive (a request started).
type wakes struct {
	now, active chan struct{}
}

// ownerClock is the pool's injected clock with the deadlines and bounded waits of
// the owner goroutines on it, so that they follow a fake clock in tests.
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

// waitFor waits for ch up to d on the clock. It reports whether ch closed.
func (c ownerClock) waitFor(ch <-chan struct{}, d time.Duration) bool {
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
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C():
		return false
	}
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

package store

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// A flight is one download (or one verification of a local file) that every Fetch of
// the same file waits for. It runs on its own goroutine under a context that is
// cancelled when the last waiter leaves.
type flight struct {
	done   chan struct{}
	cancel context.CancelFunc
	// waiters is guarded by Store.mu.
	waiters int

	// Set before done is closed.
	path string
	size int64
	err  error

	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

// run is what a flight does: it reports progress and returns the file's path and size.
type run func(ctx context.Context, report func(done, total int64)) (path string, size int64, err error)

// join waits for the flight of key, starting it with fn when there is none. It returns
// when the flight ends or ctx is done; the last waiter to leave cancels the flight and
// waits for it to stop, so that a cancelled Fetch has really stopped writing.
func (s *Store) join(ctx context.Context, key, what string, progress func(done, total int64), fn run) (string, error) {
	s.mu.Lock()
	f := s.flights[key]
	if f == nil {
		// The flight keeps the first caller's values (its logger) but not its
		// cancellation: the other waiters may still want the file.
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight{done: make(chan struct{}), cancel: cancel, subs: map[*subscriber]struct{}{}}
		s.flights[key] = f
		go func() {
			path, size, err := fn(fctx, f.report)
			s.mu.Lock()
			if s.flights[key] == f {
				delete(s.flights, key)
			}
			s.mu.Unlock()
			f.path, f.size, f.err = path, size, err
			cancel()
			close(f.done)
		}()
	}
	f.waiters++
	sub := f.subscribe(progress, s.clock, s.progressInterval)
	s.mu.Unlock()

	select {
	case <-f.done:
		sub.close()
		if f.err != nil {
			return "", f.err
		}
		sub.final(f.size)
		return f.path, nil
	case <-ctx.Done():
	}
	sub.close()
	s.mu.Lock()
	f.waiters--
	last := f.waiters == 0
	if last {
		// Later callers start a new flight; the file lock orders it after this one.
		if s.flights[key] == f {
			delete(s.flights, key)
		}
		f.cancel()
	}
	s.mu.Unlock()
	if last {
		<-f.done
	}
	return "", fmt.Errorf("fetching %s: %w", what, context.Cause(ctx))
}

// waiting is the number of callers waiting for the flight of key (tests).
func (s *Store) waiting(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.flights[key]; f != nil {
		return f.waiters
	}
	return 0
}

func (f *flight) subscribe(fn func(done, total int64), clk clock.PassiveClock, interval time.Duration) *subscriber {
	sub := &subscriber{fn: fn, clock: clk, th: throttle{interval: interval}}
	if fn == nil {
		return sub
	}
	f.mu.Lock()
	f.subs[sub] = struct{}{}
	f.mu.Unlock()
	return sub
}

func (f *flight) report(done, total int64) {
	f.mu.Lock()
	subs := make([]*subscriber, 0, len(f.subs))
	for s := range f.subs {
		subs = append(subs, s)
	}
	f.mu.Unlock()
	for _, s := range subs {
		s.offer(done, total)
	}
}

// A subscriber is one caller's progress callback. Its mutex makes sure the callback is
// never called concurrently nor after Fetch returned.
type subscriber struct {
	clock clock.PassiveClock

	mu     sync.Mutex
	fn     func(done, total int64)
	closed bool
	th     throttle
}

func (s *subscriber) offer(done, total int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.fn == nil || !s.th.due(done, total, s.clock.Now()) {
		return
	}
	s.fn(done, total)
}

func (s *subscriber) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// final reports the finished size unless that was the last report.
func (s *subscriber) final(size int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fn == nil || (s.th.started && s.th.lastDone == size && s.th.lastTotal == size) {
		return
	}
	s.th.started, s.th.lastDone, s.th.lastTotal = true, size, size
	s.fn(size, size)
}

// throttle decides which progress reports reach a callback: the first one, then one
// whenever another 1% of the total has arrived or interval has passed since the last
// one that got through, and the one completing the total.
type throttle struct {
	interval  time.Duration
	started   bool
	last      time.Time
	lastDone  int64
	lastTotal int64
}

func (t *throttle) due(done, total int64, now time.Time) bool {
	ok := !t.started ||
		total != t.lastTotal ||
		(done != t.lastDone && (now.Sub(t.last) >= t.interval ||
			(total > 0 && (done == total || done-t.lastDone >= max(total/100, 1)))))
	if ok {
		t.started, t.last, t.lastDone, t.lastTotal = true, now, done, total
	}
	return ok
}

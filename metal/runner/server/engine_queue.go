//go:build cgo && !race

package server

import (
	"slices"
	"sync"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// jobQueue is what an engine shares with the handlers: the jobs queued for a slot,
// every job the engine has not let go of yet (pending or in a slot: abort reaches
// them, /status counts them), whether the engine is closing, and the figures /status
// reports. The handlers submit and abort; the engine goroutine alone takes jobs out.
// Each method takes the lock once.
type jobQueue struct {
	wake chan struct{} // pokes the engine goroutine (coalesced)

	mu       sync.Mutex
	pending  []*job
	active   map[*job]struct{} // pending or in a slot, until the engine lets go of it
	closed   bool
	closeErr *runnerapi.Error
	busy     int
	kvUsed   int
}

func newJobQueue() *jobQueue {
	return &jobQueue{wake: make(chan struct{}, 1), active: map[*job]struct{}{}}
}

// submit queues a job; it fails once the engine is closing.
func (q *jobQueue) submit(j *job) *runnerapi.Error {
	q.mu.Lock()
	if q.closed {
		err := q.closeErr
		q.mu.Unlock()
		return err
	}
	q.pending = append(q.pending, j)
	q.active[j] = struct{}{}
	q.mu.Unlock()
	q.poke()
	return nil
}

func (q *jobQueue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// abortAll ends every job with err at once (their handlers send it); the engine frees
// their slots at its next step. It returns how many jobs it ended.
func (q *jobQueue) abortAll(err *runnerapi.Error) int {
	q.mu.Lock()
	n := 0
	for j := range q.active {
		if j.fail(err) {
			n++
		}
	}
	q.mu.Unlock()
	q.poke()
	return n
}

// close refuses new jobs with err from now on; it reports whether the queue was open.
func (q *jobQueue) close(err *runnerapi.Error) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	open := !q.closed
	q.closed, q.closeErr = true, err
	return open
}

// stats returns the slots in use, the KV cells holding tokens and the live jobs.
func (q *jobQueue) stats() (busy, kvUsed, requests int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.busy, q.kvUsed, len(q.active)
}

// publish records the figures /status reports (engine goroutine).
func (q *jobQueue) publish(busy, kvUsed int) {
	q.mu.Lock()
	q.busy, q.kvUsed = busy, kvUsed
	q.mu.Unlock()
}

// prune drops the queued jobs that ended (client gone, aborted).
func (q *jobQueue) prune() {
	q.mu.Lock()
	defer q.mu.Unlock()
	live := q.pending[:0]
	for _, j := range q.pending {
		if j.finished() {
			delete(q.active, j)
			continue
		}
		live = append(live, j)
	}
	clear(q.pending[len(live):])
	q.pending = live
}

// at is the i-th queued job in arrival order, nil past the last. Only the engine
// goroutine takes jobs out, so i still names it when it calls take.
func (q *jobQueue) at(i int) *job {
	q.mu.Lock()
	defer q.mu.Unlock()
	if i >= len(q.pending) {
		return nil
	}
	return q.pending[i]
}

// take removes the i-th queued job: it goes into a slot (it stays active).
func (q *jobQueue) take(i int) {
	q.mu.Lock()
	q.pending = slices.Delete(q.pending, i, i+1)
	q.mu.Unlock()
}

// letGo forgets a job the engine no longer holds.
func (q *jobQueue) letGo(j *job) {
	q.mu.Lock()
	delete(q.active, j)
	q.mu.Unlock()
}

// drain ends every queued job with the close error and forgets them; it returns that
// error, for the jobs in slots.
func (q *jobQueue) drain() *runnerapi.Error {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range q.pending {
		j.fail(q.closeErr)
		delete(q.active, j)
	}
	q.pending = nil
	return q.closeErr
}

// live is the number of jobs the engine holds, pending or in a slot.
func (q *jobQueue) live() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.active)
}

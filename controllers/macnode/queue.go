package macnode

import (
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// clockedQueue is a controller work queue whose AddAfter — what a Reconcile's
// RequeueAfter becomes — waits on the reconciler's clock, so that "requeue when the
// Lease expires" is measured in the same time base as the expiry itself (and a test
// stepping a fake clock sees the requeue fire). Rate-limited retries after errors
// keep waiting on the real clock: a fake clock must not stall them.
type clockedQueue[T comparable] struct {
	workqueue.TypedRateLimitingInterface[T]
	delayed workqueue.TypedDelayingInterface[T]
	clock   clock.PassiveClock
	// requeued, when set, is told each delayed item and when it becomes ready, once
	// that time is fixed (tests step the fake clock only after it).
	requeued func(item T, readyAt time.Time)
}

// newClockedQueue returns a rate-limiting queue named name (for its metrics) whose
// AddAfter delays are measured by clk. It forwards ripe items until ShutDown.
func newClockedQueue[T comparable](name string, rl workqueue.TypedRateLimiter[T], clk clock.WithTicker) *clockedQueue[T] {
	q := &clockedQueue[T]{
		TypedRateLimitingInterface: workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[T]{Name: name}),
		// Unnamed: the delayed items are counted by the main queue once they are ripe.
		delayed: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[T]{Clock: clk}),
		clock:   clk,
	}
	go q.forward()
	return q
}

func (q *clockedQueue[T]) forward() {
	for {
		item, shutdown := q.delayed.Get()
		if shutdown {
			return
		}
		q.TypedRateLimitingInterface.Add(item)
		q.delayed.Done(item)
	}
}

// AddAfter adds item once d has passed on the queue's clock.
func (q *clockedQueue[T]) AddAfter(item T, d time.Duration) {
	if d <= 0 {
		q.TypedRateLimitingInterface.Add(item)
		return
	}
	readyAt := q.clock.Now().Add(d)
	q.delayed.AddAfter(item, d)
	if q.requeued != nil {
		q.requeued(item, readyAt)
	}
}

// ShutDown stops both queues; items still waiting for their time are dropped.
func (q *clockedQueue[T]) ShutDown() {
	q.delayed.ShutDown()
	q.TypedRateLimitingInterface.ShutDown()
}

// ShutDownWithDrain stops both queues after the items being processed are done.
func (q *clockedQueue[T]) ShutDownWithDrain() {
	q.delayed.ShutDown()
	q.TypedRateLimitingInterface.ShutDownWithDrain()
}

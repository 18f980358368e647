package macnode

import (
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestClockedQueue proves that AddAfter waits on the injected clock, while
// rate-limited retries do not wait for it.
func TestClockedQueue(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	q := newClockedQueue("", workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Millisecond, time.Millisecond), clk)
	defer q.ShutDown()

	q.AddAfter("later", time.Minute)
	q.AddRateLimited("retry")
	q.AddAfter("now", 0)
	for _, want := range []string{"now", "retry"} {
		testenv.Eventually(t, 5*time.Second, time.Millisecond, func() (bool, string) { return q.Len() > 0, "queue is empty" })
		got, _ := q.Get()
		q.Done(got)
		if got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}

	// Wait until the delayed item is waiting on the fake clock before stepping it.
	testenv.Eventually(t, 5*time.Second, time.Millisecond, func() (bool, string) { return clk.HasWaiters(), "no timer on the fake clock" })
	clk.Step(59 * time.Second)
	if q.Len() != 0 {
		t.Fatalf("item ready before its time: len %d", q.Len())
	}
	clk.Step(time.Second)
	testenv.Eventually(t, 5*time.Second, time.Millisecond, func() (bool, string) { return q.Len() == 1, "delayed item not forwarded after its time" })
	if got, _ := q.Get(); got != "later" {
		t.Fatalf("got %q, want later", got)
	}
}

package wake

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/gateway/routing"
)

// TestHold: the first request held for a deployment writes its wake; another held
// while that wake is recent writes none; a failed write fails the hold and is
// counted; the deployment is tracked while requests are held.
func TestHold(t *testing.T) {
	var mu sync.Mutex
	var writes int
	var fail error
	results := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "wakes"}, []string{"model", "result"})
	w := New(Config{Write: func(context.Context, string, string, time.Time) error {
		mu.Lock()
		defer mu.Unlock()
		writes++
		return fail
	}, Table: func() *routing.Table { return routing.TableOf() }, Results: results, Log: logr.Discard()})
	rt := &routing.Route{Namespace: "a", Deployment: "m"}

	release1, err := w.Hold(t.Context(), rt)
	if err != nil || writes != 1 {
		t.Fatalf("the first hold: %v, %d writes; want one write", err, writes)
	}
	release2, err := w.Hold(t.Context(), rt)
	if err != nil || writes != 1 {
		t.Fatalf("a second hold while the wake is recent: %v, %d writes; want none more", err, writes)
	}
	if n := w.Tracking(); n != 1 {
		t.Errorf("tracking %d deployments, want 1", n)
	}
	release1()
	release2()

	mu.Lock()
	fail = errors.New("forbidden")
	mu.Unlock()
	if _, err := w.Hold(t.Context(), &routing.Route{Namespace: "a", Deployment: "other"}); err == nil {
		t.Fatal("a hold whose write failed succeeded")
	}
	if got := testutil.ToFloat64(results.WithLabelValues("a/other", "error")); got != 1 {
		t.Errorf("failed writes counted %v, want 1", got)
	}
	if got := testutil.ToFloat64(results.WithLabelValues("a/m", "written")); got != 1 {
		t.Errorf("writes counted %v, want 1", got)
	}
}

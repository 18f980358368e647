// Package wake tells the autoscaler which autoscaled deployments have requests held
// with no routable replica: the gateway writes a deployment's wake annotation
// (mfv1.AnnotationWakeRequested) while it holds requests for it.
package wake

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/routing"
)

// Func records on a ModelDeployment that a gateway holds requests for it
// (mfv1.AnnotationWakeRequested = at). The gateway's Run writes a merge patch of the
// annotation.
type Func func(ctx context.Context, namespace, name string, at time.Time) error

// wakeWriteTimeout bounds one write of the wake.
const wakeWriteTimeout = 10 * time.Second

// Waker tells the autoscaler which autoscaled deployments have requests waiting with no
// routable replica. The first request held for a deployment writes the wake before it
// waits, so a deployment at zero starts coming back at once, and a write that fails
// fails the request at once rather than after ColdStartTimeout. While any request is
// held for it, the wake is renewed every mfv1.WakeRenewInterval, so the autoscaler also
// keeps a replica that is still loading. A write is skipped while the annotation, as
// this gateway last wrote or saw it, is younger than the renew interval: several
// gateway replicas holding requests for one deployment mostly write once between them.
type Waker struct {
	write   Func
	now     func() time.Time
	renew   time.Duration
	table   func() *routing.Table
	log     logr.Logger
	results *prometheus.CounterVec

	mu    sync.Mutex
	waits map[string]*wakeState
}

// wakeState is one deployment's held requests and its wake writes.
type wakeState struct {
	namespace, name string
	holders         int
	// written is the time of this gateway's last successful write.
	written time.Time
	// writing is closed when the write in progress ends; err is its result.
	writing chan struct{}
	err     error
	// renewing: a renewal loop runs for this deployment.
	renewing bool
}

// Config configures a Waker: Write records a wake, Table is the gateway's current
// routing table (the wake a deployment shows), Results counts the writes by
// deployment and result (written, error), and Renew is how often a wake is renewed
// while requests are held (mfv1.WakeRenewInterval when zero).
type Config struct {
	Write   Func
	Table   func() *routing.Table
	Results *prometheus.CounterVec
	Log     logr.Logger
	Renew   time.Duration
}

// New is a waker as c configures it.
func New(c Config) *Waker {
	if c.Renew <= 0 {
		c.Renew = mfv1.WakeRenewInterval
	}
	return &Waker{write: c.Write, now: time.Now, renew: c.Renew, table: c.Table, log: c.Log,
		results: c.Results, waits: map[string]*wakeState{}}
}

// Tracking is how many deployments the waker holds requests for or renews the wake
// of.
func (w *Waker) Tracking() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waits)
}

// Hold registers a request held for rt while none of its replicas is routable. It
// returns once the wake is recorded (or a recent one stands), with release to call
// when the request stops waiting; a failed write returns its error and no hold.
func (w *Waker) Hold(ctx context.Context, rt *routing.Route) (release func(), err error) {
	id := rt.ID()
	w.mu.Lock()
	st := w.waits[id]
	if st == nil {
		st = &wakeState{namespace: rt.Namespace, name: rt.Deployment}
		w.waits[id] = st
	}
	st.holders++
	if !st.renewing {
		st.renewing = true
		go w.renewLoop(id, st)
	}
	w.mu.Unlock()
	release = func() {
		w.mu.Lock()
		st.holders--
		w.mu.Unlock()
	}
	if err := w.ensure(ctx, id, st, rt.WakeRequested); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// ensure writes the wake unless one younger than the renew interval stands (this
// gateway's or the one seen on the deployment), waiting for a write in progress
// instead of starting another.
func (w *Waker) ensure(ctx context.Context, id string, st *wakeState, seen time.Time) error {
	for {
		w.mu.Lock()
		if ch := st.writing; ch != nil {
			w.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
			w.mu.Lock()
			err := st.err
			w.mu.Unlock()
			if err != nil {
				return err
			}
			continue
		}
		now := w.now()
		if last := latest(st.written, seen); !last.IsZero() && now.Sub(last) < w.renew && last.Sub(now) < w.renew {
			w.mu.Unlock()
			return nil
		}
		ch := make(chan struct{})
		st.writing = ch
		w.mu.Unlock()

		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeWriteTimeout)
		err := w.write(wctx, st.namespace, st.name, now)
		cancel()
		w.mu.Lock()
		st.writing, st.err = nil, err
		if err == nil {
			st.written = now
		}
		w.mu.Unlock()
		close(ch)
		if err != nil {
			w.results.WithLabelValues(id, "error").Inc()
			w.log.Error(err, "Could not record the wake of an autoscaled deployment", "model", id)
			return fmt.Errorf("the gateway could not ask the autoscaler for a replica of deployment %s: %w "+
				"(the gateway's identity needs patch on modeldeployments, as the chart's macfleet-gateway ClusterRole grants)", id, err)
		}
		w.results.WithLabelValues(id, "written").Inc()
		w.log.V(1).Info("Recorded the wake of an autoscaled deployment with held requests", "model", id, "at", now)
		return nil
	}
}

// renewLoop renews a deployment's wake every renew interval while requests are held
// for it, and forgets the deployment once none is.
func (w *Waker) renewLoop(id string, st *wakeState) {
	t := time.NewTicker(w.renew)
	defer t.Stop()
	for range t.C {
		w.mu.Lock()
		if st.holders == 0 {
			st.renewing = false
			if w.waits[id] == st {
				delete(w.waits, id)
			}
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		var seen time.Time
		if rt := w.table().Route(id); rt != nil {
			seen = rt.WakeRequested
		}
		// A failed renewal is logged and counted; the held requests keep waiting until
		// their own deadline, and the next tick tries again.
		_ = w.ensure(context.Background(), id, st, seen)
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

package clustermode

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// statusUpdate is the agent's latest view of one replica's status.
type statusUpdate struct {
	key   types.NamespacedName
	uid   types.UID
	owned v1alpha1.ModelReplicaStatus
}

// statusWriter writes replica statuses to the API server: at most one write in flight
// per replica, the latest submitted state wins (intermediate ones are dropped), and a
// failed write is retried with a capped backoff until it succeeds, the replica is
// gone, or a newer state replaces it. Nothing that serves requests ever waits for it.
type statusWriter struct {
	// cached reads the informer's copy; live reads the API server (after a conflict).
	cached, live client.Reader
	writer       client.StatusClient
	clock        clock.WithTicker
	log          logr.Logger
	// retryInitial doubles per consecutive failure up to retryMax.
	retryInitial, retryMax time.Duration
	// written is called after each successful write (tests and metrics).
	written func(types.NamespacedName)

	mu      sync.Mutex
	ctx     context.Context
	pending map[types.NamespacedName]statusUpdate
	running map[types.NamespacedName]bool
	wg      sync.WaitGroup
}

func newStatusWriter(cached, live client.Reader, w client.StatusClient, clk clock.WithTicker, log logr.Logger) *statusWriter {
	return &statusWriter{cached: cached, live: live, writer: w, clock: clk, log: log,
		retryInitial: 200 * time.Millisecond, retryMax: 5 * time.Second,
		pending: map[types.NamespacedName]statusUpdate{}, running: map[types.NamespacedName]bool{}}
}

// start sets the context of every write; submissions before it wait for it.
func (w *statusWriter) start(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ctx = ctx
	for key := range w.pending {
		w.launchLocked(key)
	}
}

// wait returns once no write is in flight (after the context of start ended).
func (w *statusWriter) wait() { w.wg.Wait() }

// submit records u as the state to write for its replica and starts a writer for it
// if none runs.
func (w *statusWriter) submit(u statusUpdate) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending[u.key] = u
	if w.ctx != nil {
		w.launchLocked(u.key)
	}
}

func (w *statusWriter) launchLocked(key types.NamespacedName) {
	if w.running[key] || w.ctx.Err() != nil {
		return
	}
	w.running[key] = true
	w.wg.Add(1)
	go w.run(w.ctx, key)
}

// run writes key's latest state until nothing is pending for it.
func (w *statusWriter) run(ctx context.Context, key types.NamespacedName) {
	defer w.wg.Done()
	delay := w.retryInitial
	for {
		w.mu.Lock()
		u, ok := w.pending[key]
		if !ok || ctx.Err() != nil {
			delete(w.running, key)
			w.mu.Unlock()
			return
		}
		delete(w.pending, key)
		w.mu.Unlock()

		err := w.write(ctx, u)
		if err == nil {
			delay = w.retryInitial
			if w.written != nil {
				w.written(key)
			}
			continue
		}
		if ctx.Err() != nil {
			continue
		}
		w.log.V(1).Info("Writing the replica status failed; retrying", "ModelReplica", klog.KRef(key.Namespace, key.Name),
			"err", err.Error(), "retryIn", delay)
		w.mu.Lock()
		if _, newer := w.pending[key]; !newer {
			w.pending[key] = u
		}
		w.mu.Unlock()
		t := w.clock.NewTimer(delay)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
		}
		delay = min(2*delay, w.retryMax)
	}
}

// write applies u to the replica with a merge patch of its status under an
// optimistic lock, so fields and conditions of other writers are never overwritten
// with stale values. A conflict re-reads the replica from the API server once.
// A replica that is gone (or was replaced by one with another UID) is not an error.
//
// With the node authorizer (internal/nodeauthz) the API server answers a live read of a
// replica the manager no longer knows as this node's with 403, not 404: after the
// informer lost it too, that is the replica gone (deleted, or replaced and bound
// elsewhere). A 403 while the informer still has it is retried like any error.
func (w *statusWriter) write(ctx context.Context, u statusUpdate) error {
	readers := []client.Reader{w.cached, w.live}
	var err error
	cachedGone := false
	for _, r := range readers {
		var mr v1alpha1.ModelReplica
		if err = r.Get(ctx, u.key, &mr); err != nil {
			if apierrors.IsNotFound(err) {
				if r == w.cached {
					cachedGone = true
					continue // the cache may lag behind a create
				}
				return nil
			}
			if r == w.live && cachedGone && apierrors.IsForbidden(err) {
				return nil
			}
			return fmt.Errorf("reading the replica: %w", err)
		}
		if mr.UID != u.uid {
			if r == w.cached {
				continue
			}
			return nil
		}
		before := mr.DeepCopy()
		applyOwned(&mr.Status, u.owned, w.clock.Now())
		if equality.Semantic.DeepEqual(before.Status, mr.Status) {
			return nil
		}
		err = w.writer.Status().Patch(ctx, &mr, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		if err == nil {
			return nil
		}
		if apierrors.IsNotFound(err) {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("patching the replica status: %w", err)
		}
	}
	return err
}

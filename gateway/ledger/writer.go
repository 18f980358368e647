package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// DefaultFlushInterval is how often a replica publishes the namespaces whose counts
// changed: at most once per interval each, every change of the interval in one
// write. The other replicas see a change after about this long plus a watch event's
// delay, which bounds how far they can overshoot a budget together.
const DefaultFlushInterval = 200 * time.Millisecond

// DefaultRetention is how long a replica keeps its own records of past days.
const DefaultRetention = 90 * 24 * time.Hour

// pruneEvery is how often the records older than the retention are deleted.
const pruneEvery = time.Hour

// Writer publishes a Ledger to its TokenUsage records; it is a manager Runnable.
// Before its first write it reads back the replica's own records of the day, so a
// restarted replica counts on from where it stopped.
type Writer struct {
	Ledger *Ledger
	// Client writes the records; Reader lists them (the gateway's informer cache).
	Client client.Client
	Reader client.Reader
	// Interval is the flush interval (DefaultFlushInterval); Retention how long past
	// days' records are kept (DefaultRetention).
	Interval  time.Duration
	Retention time.Duration
	Log       logr.Logger

	restored atomic.Bool
}

// Restored reports whether the replica's own records were read back: its counts
// include its earlier life's.
func (w *Writer) Restored() bool { return w.restored.Load() }

// Start restores, then writes every Interval and prunes every hour until ctx ends.
func (w *Writer) Start(ctx context.Context) error {
	interval, retention := w.Interval, w.Retention
	if interval <= 0 {
		interval = DefaultFlushInterval
	}
	if retention <= 0 {
		retention = DefaultRetention
	}
	for {
		err := w.restore(ctx)
		if err == nil {
			break
		}
		w.Log.Error(err, "Reading back the usage records; retrying")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	w.restored.Store(true)
	w.prune(ctx, retention)
	lastPrune := time.Now()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			// The last counts, written with a context of their own.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			w.flush(fctx)
			cancel()
			return nil
		case <-tick.C:
		}
		w.flush(ctx)
		if time.Since(lastPrune) >= pruneEvery {
			w.prune(ctx, retention)
			lastPrune = time.Now()
		}
	}
}

// ownRecords lists the replica's records, every namespace's.
func (w *Writer) ownRecords(ctx context.Context) ([]mfv1.TokenUsage, error) {
	var l mfv1.TokenUsageList
	if err := w.Reader.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("listing TokenUsages: %w", err)
	}
	own := l.Items[:0]
	for _, tu := range l.Items {
		if tu.Spec.Gateway == w.Ledger.Gateway() {
			own = append(own, tu)
		}
	}
	return own, nil
}

func (w *Writer) restore(ctx context.Context) error {
	own, err := w.ownRecords(ctx)
	if err != nil {
		return err
	}
	for i := range own {
		w.Ledger.Restore(&own[i])
	}
	return nil
}

// flush writes what the ledger gives; a failed write is retried at the next tick.
func (w *Writer) flush(ctx context.Context) {
	for _, tu := range w.Ledger.Take() {
		err := w.write(ctx, tu)
		switch {
		case err == nil:
		case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			w.Log.Info("Not writing usage records in a namespace being deleted", "namespace", tu.Namespace, "retryAfter", ClosingWait)
			w.Ledger.Closing(tu.Namespace)
		default:
			w.Log.Info("Writing a usage record failed; retrying", "TokenUsage", tu.Namespace+"/"+tu.Name, "err", err.Error())
			w.Ledger.Retry(tu)
		}
	}
}

// write replaces the record's spec with a merge patch (the replica is its only
// writer), or creates it. Its windows are always sent, an empty list too: once the
// last key's requests in flight end with nothing counted in the current minute or
// hour, the record must lose their window, not keep it as it was (a merge patch
// leaves a field it does not name).
func (w *Writer) write(ctx context.Context, tu *mfv1.TokenUsage) error {
	spec, err := json.Marshal(tu.Spec)
	if err != nil {
		return err
	}
	var fields map[string]any
	if err := json.Unmarshal(spec, &fields); err != nil {
		return err
	}
	if len(tu.Spec.Windows) == 0 {
		fields["windows"] = []any{}
	}
	patch, err := json.Marshal(map[string]any{"spec": fields})
	if err != nil {
		return err
	}
	obj := &mfv1.TokenUsage{}
	obj.Namespace, obj.Name = tu.Namespace, tu.Name
	err = w.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch))
	if !apierrors.IsNotFound(err) {
		return err
	}
	return w.Client.Create(ctx, tu.DeepCopy())
}

// prune deletes the replica's records of days before the retention.
func (w *Writer) prune(ctx context.Context, retention time.Duration) {
	own, err := w.ownRecords(ctx)
	if err != nil {
		w.Log.Info("Listing usage records to prune failed", "err", err.Error())
		return
	}
	oldest := w.Ledger.clock.Now().Add(-retention).UTC().Format(time.DateOnly)
	for i := range own {
		tu := &own[i]
		if tu.Spec.Day >= oldest {
			continue
		}
		if err := w.Client.Delete(ctx, tu); client.IgnoreNotFound(err) != nil {
			w.Log.Info("Deleting an expired usage record failed", "TokenUsage", tu.Namespace+"/"+tu.Name, "err", err.Error())
			continue
		}
		w.Log.V(1).Info("Deleted an expired usage record", "TokenUsage", tu.Namespace+"/"+tu.Name, "day", tu.Spec.Day)
	}
}

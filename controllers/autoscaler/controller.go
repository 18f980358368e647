package autoscaler

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// ControllerName names the controller in metrics, logs and Events.
const ControllerName = "autoscaler"

// Defaults for unset Reconciler fields.
const (
	// DefaultInterval is how often an autoscaled deployment's load is measured.
	DefaultInterval                = 5 * time.Second
	DefaultMaxConcurrentReconciles = 4
)

// Reconciler measures each autoscaled ModelDeployment's load every Interval, keeps
// the samples its windows need in memory, and applies Recommend: it writes
// spec.replicas (a merge patch with the optimistic lock, as `kubectl scale` would),
// records an Event on each scale, and reports the decision in status.autoscaling and
// the Autoscaling condition — the only parts of the status it writes.
//
// API writes per autoscaled deployment: measuring writes nothing; a pass writes
// spec.replicas only when it scales and the status only when the decision or its
// episode changes (Recommend's messages carry no per-measurement numbers, and an
// episode outlasts breaks of up to StaleAfter). Steady load costs no write; each
// scale costs a spec patch, a status patch, the next measurement's status patch and
// an Event; each episode that does not scale yet (ScaleUpStabilizing,
// ScaleDownDelayed, AtMaxReplicas, AtQuota) one status patch. TestAutoscalerWriteBudget
// measures it; macfleet_autoscaler_api_writes_total counts it in production.
type Reconciler struct {
	// Client reads deployments (the manager's cache) and writes their spec.replicas and
	// status. Default: mgr.GetClient().
	Client client.Client
	// APIReader re-reads a deployment after a write conflict. Default: mgr.GetAPIReader().
	APIReader client.Reader
	// Source measures the load. Required.
	Source LoadSource
	// Clock stamps samples and conditions. Default: clock.RealClock{}.
	Clock clock.PassiveClock
	// Recorder emits an Event on each scale. Default: mgr.GetEventRecorder(ControllerName).
	Recorder events.EventRecorder
	// Interval between measurements. Default: DefaultInterval.
	Interval time.Duration
	// StaleAfter: with no successful measurement for this long the replicas are kept
	// and the condition is Unknown. Default: 3 × Interval.
	StaleAfter time.Duration
	// MaxConcurrentReconciles lets slow agents of one deployment not hold up the
	// others. Default: DefaultMaxConcurrentReconciles.
	MaxConcurrentReconciles int

	mu        sync.Mutex
	histories map[types.NamespacedName]*history
}

// history is one deployment's recent load.
type history struct {
	uid     types.UID
	samples []Sample
	lastErr error
}

// +kubebuilder:rbac:groups=macfleet.dev,resources=modeldeployments,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modeldeployments/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modelreplicas,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=macnodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=fleetquotas,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the controller with mgr, filling in unset fields.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return r.setup(mgr, controller.Options{})
}

func (r *Reconciler) setup(mgr ctrl.Manager, opts controller.Options) error {
	if r.Source == nil {
		return fmt.Errorf("the autoscaler needs a load source")
	}
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder(ControllerName)
	}
	if r.Interval <= 0 {
		r.Interval = DefaultInterval
	}
	if r.StaleAfter <= 0 {
		r.StaleAfter = 3 * r.Interval
	}
	if r.MaxConcurrentReconciles <= 0 {
		r.MaxConcurrentReconciles = DefaultMaxConcurrentReconciles
	}
	r.histories = map[types.NamespacedName]*history{}
	opts.MaxConcurrentReconciles = r.MaxConcurrentReconciles
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		// Spec changes (autoscaling set or changed, replicas scaled by someone) and a
		// gateway's wake (an annotation) start a pass at once; RequeueAfter paces the
		// measurements.
		For(&v1alpha1.ModelDeployment{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		WithOptions(opts).
		Complete(r)
}

// Reconcile measures one deployment's load and applies the recommendation.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	md := &v1alpha1.ModelDeployment{}
	if err := r.Client.Get(ctx, req.NamespacedName, md); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	policy, ok := PolicyFor(md, r.StaleAfter)
	if !ok || md.DeletionTimestamp != nil {
		r.forget(req.NamespacedName)
		return ctrl.Result{}, r.patchStatus(ctx, md, clearAutoscalingStatus)
	}

	now := r.Clock.Now()
	samples, measureErr := r.measure(ctx, md, policy, now)
	current := ptr.Deref(md.Spec.Replicas, 1)
	rec := Recommend(samples, policy, current, now)
	if !rec.Known() && measureErr != nil {
		rec.Message += ": " + measureErr.Error()
	}
	room, limited, err := r.loadQuotaRoom(ctx, md)
	if err != nil {
		return ctrl.Result{}, err
	}
	rec = limitByQuota(rec, current, room, limited)
	recommended.WithLabelValues(deploymentLabel(md)).Set(float64(rec.Replicas))
	scaled := rec.Replicas != current
	if scaled {
		if err := r.scale(ctx, md, rec); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.patchStatus(ctx, md, func(md *v1alpha1.ModelDeployment) {
		setAutoscalingStatus(md, policy, rec, scaled, now)
	}); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: measureEvery(r.Interval, policy.StabilizationWindow)}, nil
}

// measureEvery is how soon a deployment is measured again: every interval, or five
// times per stabilization window when that is shorter (but not more often than once a
// second, unless interval itself is shorter), so that a scale-up comes within about
// 1.2 windows of a step in load whatever the window.
func measureEvery(interval, window time.Duration) time.Duration {
	if w := window / 5; w > 0 && w < interval {
		return max(w, min(interval, time.Second))
	}
	return interval
}

// measure adds a sample of md's load at now to its history (nothing when the source
// fails) and returns the history with what no window needs any more dropped.
func (r *Reconciler) measure(ctx context.Context, md *v1alpha1.ModelDeployment, p Policy, now time.Time) ([]Sample, error) {
	load, err := r.Source.Measure(ctx, md)
	if woken, _ := Woken(md, now); woken && err == nil {
		// A gateway holds requests no replica can take yet: at least one is held.
		load.Held = max(load.Held, 1)
	}
	key := client.ObjectKeyFromObject(md)
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.histories[key]
	if h == nil || h.uid != md.UID {
		h = &history{uid: md.UID}
		r.histories[key] = h
	}
	h.lastErr = err
	if err != nil {
		log.FromContext(ctx).V(1).Info("Measuring the load failed", "error", err.Error())
	} else {
		inflight.WithLabelValues(deploymentLabel(md)).Set(float64(load.InFlight + load.Held))
		log.FromContext(ctx).V(2).Info("Measured the load", "inFlight", load.InFlight, "held", load.Held)
		s := Sample{Time: now, InFlight: load.InFlight, Held: load.Held}
		if n := len(h.samples); n > 0 && !h.samples[n-1].Time.Before(now) {
			h.samples[n-1] = s // the clock did not move: the newer measurement wins
		} else {
			h.samples = append(h.samples, s)
		}
	}
	h.samples = Prune(h.samples, p, now)
	return append([]Sample(nil), h.samples...), h.lastErr
}

func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	delete(r.histories, key)
	r.mu.Unlock()
	recommended.DeleteLabelValues(key.String())
	inflight.DeleteLabelValues(key.String())
}

// scale writes the recommendation to spec.replicas. The optimistic lock makes a scale
// decided on a stale read fail (and the pass run again) instead of overwriting a
// newer spec.replicas.
func (r *Reconciler) scale(ctx context.Context, md *v1alpha1.ModelDeployment, rec Recommendation) error {
	before := md.DeepCopy()
	from := ptr.Deref(md.Spec.Replicas, 1)
	md.Spec.Replicas = ptr.To(rec.Replicas)
	if err := r.Client.Patch(ctx, md, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("scaling from %d to %d replicas: %w", from, rec.Replicas, err)
	}
	apiWrites.WithLabelValues(deploymentLabel(md), "spec").Inc()
	direction := "up"
	if rec.Replicas < from {
		direction = "down"
	}
	scales.WithLabelValues(deploymentLabel(md), direction).Inc()
	r.Recorder.Eventf(md, nil, corev1.EventTypeNormal, rec.Reason, "Scale", "%s", rec.Message)
	log.FromContext(ctx).Info("Scaled", "ModelDeployment", klog.KObj(md), "from", from, "to", rec.Replicas, "reason", rec.Reason)
	return nil
}

// patchStatus applies mutate to md's status and patches it when it changed, with the
// optimistic lock: the modeldeployment controller writes the rest of this status, and
// a merge patch replaces the whole conditions list. On a conflict the deployment is
// read again from the API server and mutate applied to the fresh copy.
func (r *Reconciler) patchStatus(ctx context.Context, md *v1alpha1.ModelDeployment, mutate func(*v1alpha1.ModelDeployment)) error {
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
				return err
			}
		}
		first = false
		before := md.DeepCopy()
		mutate(md)
		if equality.Semantic.DeepEqual(before.Status, md.Status) {
			return nil
		}
		if err := r.Client.Status().Patch(ctx, md, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return err
		}
		apiWrites.WithLabelValues(deploymentLabel(md), "status").Inc()
		return nil
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("patching the autoscaling status: %w", err)
	}
	return nil
}

func deploymentLabel(md *v1alpha1.ModelDeployment) string { return md.Namespace + "/" + md.Name }

package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// ControllerName names the controller (metrics, logs) and the reporter of its Events.
const ControllerName = "scheduler"

// DefaultWorkers is how many writes run in parallel when Reconciler.Workers is unset.
const DefaultWorkers = 8

// Event reasons, on the ModelReplica.
const (
	// EventScheduled: the replica was bound; the note is "Bound to <node>".
	EventScheduled = "Scheduled"
	// EventFailedScheduling: no node fits the replica, or the reason why changed; the
	// note is the solver's message.
	EventFailedScheduling = "FailedScheduling"
)

// FleetRequest is the only request the controller reconciles. Every change it watches
// maps to it, so a burst of changes (a thousand new replicas) coalesces in the work
// queue into a few passes, each solving the whole fleet at once.
var FleetRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "fleet"}}

// Reconciler binds pending ModelReplicas to MacNodes. Each pass lists the cached
// MacNodes, ModelReplicas, ModelDeployments and FleetQuotas, runs one Solve over all
// of them and applies the result: bindings (spec.nodeName) and Scheduled conditions.
// It is watch-driven: a pass runs whenever a replica, a node (readiness, cordon,
// ceiling, labels), a deployment's placement or a quota changes, so unplaceable
// replicas are retried exactly when something that could make them fit happened,
// with no polling.
//
// It assumes it is the only active scheduler (the manager's leader election sees to
// that); two racing schedulers still bind each replica at most once, because every
// binding is written with an optimistic lock, but may over-commit a node.
type Reconciler struct {
	// Client reads MacNodes, ModelReplicas and ModelDeployments (from the manager's
	// cache) and patches replicas' spec.nodeName and status. Default: mgr.GetClient().
	Client client.Client
	// Recorder emits the Scheduled and FailedScheduling Events.
	// Default: mgr.GetEventRecorder(ControllerName).
	Recorder events.EventRecorder
	// Clock times solves, conditions and scheduling latency. Default: clock.RealClock{}.
	Clock clock.PassiveClock
	// Workers is how many binding and condition writes run in parallel.
	// Zero or negative: DefaultWorkers.
	Workers int
	// SolverOptions is passed to every Solve.
	SolverOptions Options

	ledger ledger
}

// +kubebuilder:rbac:groups=macfleet.dev,resources=macnodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modeldeployments,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modelreplicas,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modelreplicas/status,verbs=patch
// +kubebuilder:rbac:groups=macfleet.dev,resources=fleetquotas,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the controller with mgr, filling in unset fields.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder(ControllerName)
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Workers <= 0 {
		r.Workers = DefaultWorkers
	}
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	fleet := handler.Funcs{
		CreateFunc:  func(_ context.Context, _ event.CreateEvent, q queue) { q.Add(FleetRequest) },
		UpdateFunc:  func(_ context.Context, _ event.UpdateEvent, q queue) { q.Add(FleetRequest) },
		DeleteFunc:  func(_ context.Context, _ event.DeleteEvent, q queue) { q.Add(FleetRequest) },
		GenericFunc: func(_ context.Context, _ event.GenericEvent, q queue) { q.Add(FleetRequest) },
	}
	replicas := fleet
	replicas.CreateFunc = func(_ context.Context, e event.CreateEvent, q queue) {
		// The initial list delivers replicas that existed before this scheduler
		// started; their latency is taken from their creationTimestamp instead.
		if rep, ok := e.Object.(*v1alpha1.ModelReplica); ok && rep.Spec.NodeName == "" && !e.IsInInitialList {
			r.ledger.created(rep.UID, r.Clock.Now())
		}
		q.Add(FleetRequest)
	}
	replicas.DeleteFunc = func(_ context.Context, e event.DeleteEvent, q queue) {
		r.ledger.deleted(e.Object.GetUID())
		q.Add(FleetRequest)
	}
	nodeChange := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, ok1 := e.ObjectOld.(*v1alpha1.MacNode)
		cur, ok2 := e.ObjectNew.(*v1alpha1.MacNode)
		return !ok1 || !ok2 || nodeChanged(old, cur)
	}}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		// Replicas: created, deleted, bound, resized or relabelled; not their status,
		// which agents update often.
		Watches(&v1alpha1.ModelReplica{}, replicas,
			builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		Watches(&v1alpha1.MacNode{}, fleet, builder.WithPredicates(nodeChange)).
		// Deployments: created, deleted, or their placement changed.
		Watches(&v1alpha1.ModelDeployment{}, fleet, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Quotas: created, deleted or resized (not their status, which the fleetquota
		// controller writes), so that replicas waiting for one are placed at once.
		Watches(&v1alpha1.FleetQuota{}, fleet, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// Reconcile solves the whole fleet and applies the result. Failed writes (a conflict
// included: the cache was stale, or another scheduler won) are returned as an error,
// so the pass is retried with backoff; everything that did get written stays.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)

	// Read-only views of the cache: buildView and plan never modify them, and every
	// write works on a deep copy.
	var nodes v1alpha1.MacNodeList
	var replicas v1alpha1.ModelReplicaList
	var deployments v1alpha1.ModelDeploymentList
	var quotas v1alpha1.FleetQuotaList
	for _, list := range []client.ObjectList{&nodes, &replicas, &deployments, &quotas} {
		if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
			return ctrl.Result{}, fmt.Errorf("listing %T: %w", list, err)
		}
	}
	v := buildGangView(nodes.Items, replicas.Items, deployments.Items, r.ledger.assumed)
	v.snap.Quotas = quotaSnapshot(quotas.Items, v.bound)

	start := r.Clock.Now()
	res := Solve(v.snap, r.SolverOptions)
	took := r.Clock.Since(start)
	solveDuration.Observe(took.Seconds())
	unschedulableReplicas.Set(float64(len(res.Unplaceable)))

	writes := plan(v, res, r.ledger.condition)
	logger.V(2).Info("Solved the fleet", "nodes", len(v.snap.Nodes), "pending", len(v.snap.Pending),
		"bindings", len(res.Bindings), "unschedulable", len(res.Unplaceable), "orphans", len(v.orphans),
		"writes", len(writes), "duration", took)
	if err := r.apply(ctx, writes); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// apply runs the writes on Workers goroutines. A replica deleted meanwhile is skipped.
// The error, if any, counts the failed writes and carries the first few.
func (r *Reconciler) apply(ctx context.Context, writes []write) error {
	const keep = 3
	var (
		mu     sync.Mutex
		failed int
		errs   []error
		wg     sync.WaitGroup
	)
	workers := r.Workers
	if workers <= 0 {
		workers = DefaultWorkers
	}
	work := make(chan write)
	for range min(workers, len(writes)) {
		wg.Go(func() {
			for w := range work {
				if err := r.write(ctx, w); err != nil && !apierrors.IsNotFound(err) {
					mu.Lock()
					if failed++; len(errs) < keep {
						errs = append(errs, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	for _, w := range writes {
		if ctx.Err() != nil {
			break
		}
		work <- w
	}
	close(work)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d scheduler writes failed: %w", failed, len(writes), errors.Join(errs...))
	}
	return nil
}

// write binds one replica (when w.node is set) and sets its Scheduled condition.
func (r *Reconciler) write(ctx context.Context, w write) error {
	rep := w.replica.DeepCopy()
	if w.node != "" {
		if err := r.bind(ctx, rep, w.node, w.split); err != nil {
			return err
		}
	}
	before := rep.DeepCopy()
	if !setScheduledCondition(rep, w.cond, r.Clock.Now()) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, rep, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("setting the %s condition of %s: %w", v1alpha1.ReplicaScheduled, klog.KObj(rep), err)
	}
	r.ledger.wrote(rep.UID, w.cond)
	if w.node == "" && w.cond.Reason != v1alpha1.ReasonBound {
		r.Recorder.Eventf(rep, nil, corev1.EventTypeWarning, EventFailedScheduling, "Scheduling", "%s", w.cond.Message)
	}
	return nil
}

// bind sets rep's spec.nodeName (and, for a gang, spec.split: every shard in the same
// patch, so a gang is bound whole or not at all) with a merge patch carrying rep's
// resourceVersion, so the API server rejects it if the replica changed since it was
// read (bound by another scheduler, for one); the CEL rules on nodeName and split
// forbid rebinding anyway. A gang's replica also gets, in the same patch, the label
// v1alpha1.ShardLabel of each worker shard's Mac, by which that Mac's agent finds it.
// On success rep is the replica as the API server returned it.
func (r *Reconciler) bind(ctx context.Context, rep *v1alpha1.ModelReplica, node string, split *v1alpha1.ReplicaSplit) error {
	before := rep.DeepCopy()
	rep.Spec.NodeName, rep.Spec.Split = node, split
	for _, w := range split.WorkerNodes() {
		if rep.Labels == nil {
			rep.Labels = map[string]string{}
		}
		rep.Labels[v1alpha1.ShardLabel(w)] = v1alpha1.ShardLabelWorker
	}
	if err := r.Client.Patch(ctx, rep, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("binding %s to %s: %w", klog.KObj(rep), node, err)
	}
	seen := r.ledger.boundAs(rep.UID, node, split)
	if seen.IsZero() {
		seen = rep.CreationTimestamp.Time
	}
	schedulingLatency.Observe(r.Clock.Since(seen).Seconds())
	bindingsTotal.Inc()
	r.Recorder.Eventf(rep, nil, corev1.EventTypeNormal, EventScheduled, "Binding", "%s", bindingCondition(node, split).Message)
	log.FromContext(ctx).V(2).Info("Bound replica", "ModelReplica", klog.KObj(rep), "MacNode", node)
	return nil
}

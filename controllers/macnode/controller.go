// Package macnode is the MacNode liveness controller. Each node's agent renews a
// coordination.k8s.io Lease named like the node in the macfleet-node-lease namespace;
// when the Lease expires the controller sets the node's Ready condition to Unknown
// (reason NodeLeaseExpired) at once, and after the node-loss grace period deletes the
// replicas bound to the node so that their deployments recreate them on other Macs.
package macnode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// DefaultNodeLossGrace is how long a node's Lease must stay expired before its
// replicas are deleted, when Reconciler.NodeLossGrace is not set.
const DefaultNodeLossGrace = 60 * time.Second

// ControllerName names the controller (metrics, logs) and the reporter of its Events.
const ControllerName = "macnode"

// Event reasons.
const (
	// EventNodeLeaseExpired: the node's Ready condition was set to Unknown.
	EventNodeLeaseExpired = v1alpha1.ReasonLeaseExpired
	// EventNodeLost: the grace period ended and the node's replicas were deleted.
	EventNodeLost = "NodeLost"
)

// Reconciler keeps each MacNode's Ready condition in line with its Lease and
// deletes the replicas of nodes lost for longer than NodeLossGrace.
type Reconciler struct {
	// Client reads MacNodes, Leases and ModelReplicas (from the manager's cache) and
	// writes the Ready condition and replica deletions. Default: mgr.GetClient().
	Client client.Client
	// APIReader lists a lost node's replicas straight from the API server (field
	// selector spec.nodeName), so that a deletion is never decided on a stale cache.
	// Default: mgr.GetAPIReader().
	APIReader client.Reader
	// Recorder emits the NodeLeaseExpired and NodeLost Events.
	// Default: mgr.GetEventRecorder(ControllerName).
	Recorder events.EventRecorder
	// Clock tells the time for Lease expiry and the grace period, and times
	// RequeueAfter. Default: clock.RealClock{}.
	Clock clock.WithTicker
	// NodeLossGrace is how long a Lease stays expired before the node's replicas are
	// deleted (the manager's --node-loss-grace). Zero or negative: DefaultNodeLossGrace.
	NodeLossGrace time.Duration
	// Contact, when set, tells since when the manager has been in contact with the API
	// server without a break (internal/informers.Contact): a Lease counts as live until
	// a full lease duration after that, so a Mac is not called lost for not renewing
	// while nobody could. Nil: contact is assumed unbroken.
	Contact interface{ Since(now time.Time) time.Time }
}

// CacheByObject restricts the manager's Lease cache to NodeLeaseNamespace, so that
// the controller does not cache (and is not woken by) every Lease in the cluster,
// e.g. the kubelets' ones. Merge it into the manager's cache.Options.ByObject.
func CacheByObject() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{v1alpha1.NodeLeaseNamespace: {}}},
	}
}

// +kubebuilder:rbac:groups=macfleet.dev,resources=macnodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=macnodes/status,verbs=patch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modelreplicas,verbs=list;watch;delete
// +kubebuilder:rbac:groups=macfleet.dev,resources=modelreplicas/status,verbs=patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the controller with mgr, filling in unset fields.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return r.setup(mgr, hooks{})
}

// hooks let tests observe the controller; both are optional.
type hooks struct {
	// wrap wraps the reconciler the controller calls.
	wrap func(reconcile.Reconciler) reconcile.Reconciler
	// requeued is told every RequeueAfter once the queue has fixed its time.
	requeued func(req reconcile.Request, readyAt time.Time)
}

// setup registers the controller with test hooks.
func (r *Reconciler) setup(mgr ctrl.Manager, h hooks) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder(ControllerName)
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.NodeLossGrace <= 0 {
		r.NodeLossGrace = DefaultNodeLossGrace
	}
	var rec reconcile.Reconciler = r
	if h.wrap != nil {
		rec = h.wrap(r)
	}
	toNode := func(name string) []reconcile.Request {
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: name}}}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1alpha1.MacNode{}).
		Watches(&coordinationv1.Lease{},
			handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request { return toNode(o.GetName()) }),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == v1alpha1.NodeLeaseNamespace }))).
		// A replica bound to a node that is already lost is deleted too.
		Watches(&v1alpha1.ModelReplica{},
			handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				return toNode(o.(*v1alpha1.ModelReplica).Spec.NodeName)
			}),
			builder.WithPredicates(bindingPredicate())).
		WithOptions(controller.Options{
			NewQueue: func(name string, rl workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
				q := newClockedQueue(name, rl, r.Clock)
				q.requeued = h.requeued
				return q
			},
		}).
		Complete(rec)
}

// bindingPredicate passes replicas that are created bound or become bound.
func bindingPredicate() predicate.Funcs {
	nodeName := func(o client.Object) string { return o.(*v1alpha1.ModelReplica).Spec.NodeName }
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return nodeName(e.Object) != "" },
		UpdateFunc:  func(e event.UpdateEvent) bool { return nodeName(e.ObjectOld) == "" && nodeName(e.ObjectNew) != "" },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// Reconcile compares one MacNode with its Lease: Ready=Unknown when the Lease is
// missing or expired, replica deletion once it has been so for NodeLossGrace, and a
// requeue at the moment either would next change. It also says, with the
// CeilingCapped condition, when the agent reports more memory than the Mac may have,
// and writes the ceiling the scheduler believes in status.effectiveCeiling.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	var node v1alpha1.MacNode
	if err := r.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		if apierrors.IsNotFound(err) {
			forgetReady(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	defer observeReady(&node)
	lease, err := getLease(ctx, r.Client, node.Name)
	if err != nil {
		return ctrl.Result{}, err
	}

	now := r.Clock.Now()
	var contact time.Time
	if r.Contact != nil {
		contact = r.Contact.Since(now)
	}
	live := nodeLiveness(lease, &node, now, contact, r.NodeLossGrace)
	if live.ready != "" {
		// The cache can be behind the API server: after the manager itself lost the
		// API server, its informers replay old Leases for a while, and every node
		// would look expired although its agent has renewed since. Mark a node lost
		// (or delete its replicas) only on a Lease read from the API server.
		if lease, err = r.liveLease(ctx, node.Name); err != nil {
			return ctrl.Result{}, err
		}
		live = nodeLiveness(lease, &node, now, contact, r.NodeLossGrace)
	}

	before := node.DeepCopy()
	expired := live.ready != "" && setReadyUnknown(&node, live.message, now)
	capped := setCeilingCapped(&node, now)
	if effective := setEffectiveCeiling(&node); expired || capped || effective {
		patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
		if err := r.Client.Status().Patch(ctx, &node, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("updating the conditions and effective ceiling of MacNode %s: %w", node.Name, err)
		}
	}
	if expired {
		logger.Info("Node lease expired", "MacNode", klog.KObj(&node), "reason", live.message)
		r.Recorder.Eventf(&node, nil, corev1.EventTypeWarning, EventNodeLeaseExpired, "MarkNotReady", "%s", live.message)
	}
	if live.deleteReplicas {
		if err := r.deleteReplicas(ctx, &node); err != nil {
			return ctrl.Result{}, err
		}
	} else if live.ready != "" {
		if err := r.markReplicasUnreachable(ctx, &node, now); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: live.requeueAfter}, nil
}

// markReplicasUnreachable sets Ready=Unknown on the replicas bound to a lost node that
// still say Ready=True, so that deployments stop counting them during the grace
// period. Read from the API server: a replica's status is written by its agent, and
// the cache may not have the last write.
func (r *Reconciler) markReplicasUnreachable(ctx context.Context, node *v1alpha1.MacNode, now time.Time) error {
	var list v1alpha1.ModelReplicaList
	if err := r.APIReader.List(ctx, &list, client.MatchingFields{v1alpha1.ReplicaNodeNameField: node.Name}); err != nil {
		return fmt.Errorf("listing the replicas of lost MacNode %s: %w", node.Name, err)
	}
	var errs []error
	for i := range list.Items {
		mr := &list.Items[i]
		before := mr.DeepCopy()
		if mr.DeletionTimestamp != nil || mr.Spec.NodeName != node.Name || !setReplicaUnreachable(mr, node.Name, now) {
			continue
		}
		err := r.Client.Status().Patch(ctx, mr, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("setting replica %s/%s Ready=Unknown: %w", mr.Namespace, mr.Name, err))
		}
	}
	return errors.Join(errs...)
}

// getLease reads a node's Lease; nil when there is none.
func getLease(ctx context.Context, c client.Reader, node string) (*coordinationv1.Lease, error) {
	var l coordinationv1.Lease
	switch err := c.Get(ctx, types.NamespacedName{Namespace: v1alpha1.NodeLeaseNamespace, Name: node}, &l); {
	case err == nil:
		return &l, nil
	case apierrors.IsNotFound(err):
		return nil, nil
	default:
		return nil, fmt.Errorf("getting the Lease of MacNode %s: %w", node, err)
	}
}

// liveLease reads a node's Lease from the API server, bypassing the cache.
func (r *Reconciler) liveLease(ctx context.Context, node string) (*coordinationv1.Lease, error) {
	return getLease(ctx, r.APIReader, node)
}

// deleteReplicas deletes the replicas bound to a lost node, in every namespace, and
// records one Event on the node naming them.
func (r *Reconciler) deleteReplicas(ctx context.Context, node *v1alpha1.MacNode) error {
	var list v1alpha1.ModelReplicaList
	if err := r.APIReader.List(ctx, &list, client.MatchingFields{v1alpha1.ReplicaNodeNameField: node.Name}); err != nil {
		return fmt.Errorf("listing the replicas of lost MacNode %s: %w", node.Name, err)
	}
	var deleted []string
	for i := range list.Items {
		mr := &list.Items[i]
		if mr.DeletionTimestamp != nil || mr.Spec.NodeName != node.Name {
			continue
		}
		err := r.Client.Delete(ctx, mr, client.Preconditions{UID: &mr.UID})
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone already, or replaced by a new replica of the same name.
		case err != nil:
			return fmt.Errorf("deleting replica %s of lost MacNode %s: %w", klog.KObj(mr), node.Name, err)
		default:
			deleted = append(deleted, klog.KObj(mr).String())
		}
	}
	if len(deleted) == 0 {
		return nil
	}
	log.FromContext(ctx).Info("Deleted the replicas of a lost node", "MacNode", klog.KObj(node), "replicas", deleted, "grace", r.NodeLossGrace)
	r.Recorder.Eventf(node, nil, corev1.EventTypeWarning, EventNodeLost, "DeleteReplicas",
		"Lease expired for more than %s: deleted %d replica(s) so they are recreated on other Macs: %s",
		r.NodeLossGrace, len(deleted), truncateList(deleted, 10))
	return nil
}

// truncateList joins at most n names, saying how many more there are.
func truncateList(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

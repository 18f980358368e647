// Package fleetquota is the FleetQuota controller. It reports in each FleetQuota's
// status what its namespace's placed replicas use, by deployment, and how many
// replicas wait for room. It decides nothing: the scheduler enforces the quota when
// it places replicas, from the replicas themselves.
package fleetquota

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// ControllerName names the controller in metrics and logs.
const ControllerName = "fleetquota"

// Reconciler keeps each FleetQuota's status.
type Reconciler struct {
	// Client reads quotas and replicas (the manager's cache) and writes quota status.
	// Default: mgr.GetClient().
	Client client.Client
}

// +kubebuilder:rbac:groups=macfleet.dev,resources=fleetquotas,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=fleetquotas/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modelreplicas,verbs=get;list;watch

// SetupWithManager registers the controller with mgr, filling in unset fields.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	replicaChanged := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, ok1 := e.ObjectOld.(*v1alpha1.ModelReplica)
		cur, ok2 := e.ObjectNew.(*v1alpha1.ModelReplica)
		return !ok1 || !ok2 || quotaRelevant(old, cur)
	}}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1alpha1.FleetQuota{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A replica created, bound, resized, held back or deleted changes the quotas of
		// its namespace; its other status changes (frequent) do not.
		Watches(&v1alpha1.ModelReplica{}, handler.EnqueueRequestsFromMapFunc(r.quotasOf),
			builder.WithPredicates(replicaChanged)).
		Complete(r)
}

// Reconcile writes one FleetQuota's status from its namespace's replicas.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	fq := &v1alpha1.FleetQuota{}
	if err := r.Client.Get(ctx, req.NamespacedName, fq); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var replicas v1alpha1.ModelReplicaList
	if err := r.Client.List(ctx, &replicas, client.InNamespace(fq.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing replicas: %w", err)
	}
	before := fq.DeepCopy()
	fq.Status = quotaStatus(replicas.Items)
	if equality.Semantic.DeepEqual(before.Status, fq.Status) {
		return ctrl.Result{}, nil
	}
	if err := r.Client.Status().Patch(ctx, fq, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("patching status: %w", err)
	}
	log.FromContext(ctx).V(2).Info("Updated quota usage", "used", fq.Status.Used.String(), "waitingReplicas", fq.Status.WaitingReplicas)
	return ctrl.Result{}, nil
}

// quotasOf maps a replica to the FleetQuotas of its namespace.
func (r *Reconciler) quotasOf(ctx context.Context, obj client.Object) []ctrl.Request {
	var list v1alpha1.FleetQuotaList
	if err := r.Client.List(ctx, &list, client.InNamespace(obj.GetNamespace())); err != nil {
		log.FromContext(ctx).Error(err, "Listing the quotas of a replica's namespace", "namespace", obj.GetNamespace())
		return nil
	}
	reqs := make([]ctrl.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

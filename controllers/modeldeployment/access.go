package modeldeployment

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// replicaAccess is what a replica's spec says about who may call it directly: the
// deployment's spec.access and which of the namespaces that may use it have a
// TokenBudget (their callers go through the gateway).
type replicaAccess struct {
	access   *v1alpha1.Access
	budgeted []string
}

// accessFor is what md's replicas should say, given the namespaces that have a
// TokenBudget.
func accessFor(md *v1alpha1.ModelDeployment, withBudget map[string]bool) replicaAccess {
	return replicaAccess{access: normalAccess(md.Spec.Access), budgeted: budgetedNamespaces(md, withBudget)}
}

// budgetedNamespaces is which of the namespaces that may use md — its own, those its
// spec.access grants, every namespace for "*" — have a TokenBudget (withBudget),
// sorted; nil for none.
func budgetedNamespaces(md *v1alpha1.ModelDeployment, withBudget map[string]bool) []string {
	var granted []string
	if md.Spec.Access != nil {
		granted = md.Spec.Access.Namespaces
	}
	var out []string
	for ns, has := range withBudget {
		if has && tenancy.MayUse(tenancy.Identity{Namespace: ns}, md.Namespace, granted) {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return out
}

// staleAccess is the replicas whose spec.access and spec.budgetedNamespaces are not
// want: the node agents read them to scope in-cluster callers, so they follow the
// deployment's in place (they are not part of the template, and changing them rolls
// nothing). Replicas being deleted are left alone.
func staleAccess(want replicaAccess, replicas []v1alpha1.ModelReplica) []*v1alpha1.ModelReplica {
	var out []*v1alpha1.ModelReplica
	for i := range replicas {
		mr := &replicas[i]
		if mr.DeletionTimestamp == nil && (!equality.Semantic.DeepEqual(normalAccess(mr.Spec.Access), want.access) ||
			!slices.Equal(mr.Spec.BudgetedNamespaces, want.budgeted)) {
			out = append(out, mr)
		}
	}
	return out
}

// normalAccess is a as compared: no namespaces is no access field.
func normalAccess(a *v1alpha1.Access) *v1alpha1.Access {
	if a == nil || len(a.Namespaces) == 0 {
		return nil
	}
	return a
}

// setAccess writes want into a replica's spec.
func setAccess(spec *v1alpha1.ModelReplicaSpec, want replicaAccess) {
	spec.Access = want.access.DeepCopy()
	spec.BudgetedNamespaces = slices.Clone(want.budgeted)
}

// namespacesWithBudget is the set of namespaces that have at least one TokenBudget.
func (r *Reconciler) namespacesWithBudget(ctx context.Context) (map[string]bool, error) {
	var list v1alpha1.TokenBudgetList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing token budgets: %w", err)
	}
	out := make(map[string]bool, len(list.Items))
	for _, b := range list.Items {
		out[b.Namespace] = true
	}
	return out, nil
}

// syncAccess copies want to the replicas that do not have it.
func (r *Reconciler) syncAccess(ctx context.Context, want replicaAccess, replicas []v1alpha1.ModelReplica) error {
	for _, mr := range staleAccess(want, replicas) {
		before := mr.DeepCopy()
		setAccess(&mr.Spec, want)
		if err := r.Client.Patch(ctx, mr, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("copying spec.access to replica %s: %w", mr.Name, err)
		}
	}
	return nil
}

// budgetChanged wakes the deployments a TokenBudget's namespace may use: those of
// its namespace and those whose spec.access grants it (or "*").
func (r *Reconciler) budgetChanged(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.ModelDeploymentList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "Listing deployments after a token budget change")
		return nil
	}
	var reqs []reconcile.Request
	for _, md := range list.Items {
		var granted []string
		if md.Spec.Access != nil {
			granted = md.Spec.Access.Namespaces
		}
		if tenancy.MayUse(tenancy.Identity{Namespace: o.GetNamespace()}, md.Namespace, granted) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&md)})
		}
	}
	return reqs
}

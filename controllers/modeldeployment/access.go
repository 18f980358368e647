package modeldeployment

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// staleAccess is the replicas whose spec.access is not md's spec.access: the node
// agents read a replica's access to scope in-cluster callers, so it follows the
// deployment's in place (it is not part of the template, and changing it rolls
// nothing). Replicas being deleted are left alone.
func staleAccess(md *v1alpha1.ModelDeployment, replicas []v1alpha1.ModelReplica) []*v1alpha1.ModelReplica {
	var out []*v1alpha1.ModelReplica
	for i := range replicas {
		mr := &replicas[i]
		if mr.DeletionTimestamp == nil && !equality.Semantic.DeepEqual(normalAccess(mr.Spec.Access), normalAccess(md.Spec.Access)) {
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

// syncAccess copies md's spec.access to the replicas that do not have it.
func (r *Reconciler) syncAccess(ctx context.Context, md *v1alpha1.ModelDeployment, replicas []v1alpha1.ModelReplica) error {
	for _, mr := range staleAccess(md, replicas) {
		before := mr.DeepCopy()
		mr.Spec.Access = normalAccess(md.Spec.Access).DeepCopy()
		if err := r.Client.Patch(ctx, mr, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("copying spec.access to replica %s: %w", mr.Name, err)
		}
	}
	return nil
}

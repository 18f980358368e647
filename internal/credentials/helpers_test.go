package credentials_test

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

func newLease(ns, name string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       new(name),
			LeaseDurationSeconds: new(int32(40)),
			RenewTime:            &metav1.MicroTime{Time: metav1.Now().Time},
		},
	}
}

// renewLease moves the renew time of Lease macfleet-node-lease/name forward, as an
// agent does, with an update (optimistic lock).
func renewLease(ctx context.Context, c client.Client, name string) error {
	var l coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKey{Namespace: v1alpha1.NodeLeaseNamespace, Name: name}, &l); err != nil {
		return err
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: metav1.Now().Time}
	return c.Update(ctx, &l)
}

// patchMacNode reads MacNode name with c and merge-patches what mutate changes.
func patchMacNode(ctx context.Context, c client.Client, name string, mutate func(*v1alpha1.MacNode)) error {
	var n v1alpha1.MacNode
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return err
	}
	before := n.DeepCopy()
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	mutate(&n)
	return c.Patch(ctx, &n, client.MergeFrom(before))
}

// patchMacNodeStatus is patchMacNode for the status subresource.
func patchMacNodeStatus(ctx context.Context, c client.Client, name string, mutate func(*v1alpha1.MacNode)) error {
	var n v1alpha1.MacNode
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return err
	}
	before := n.DeepCopy()
	mutate(&n)
	return c.Status().Patch(ctx, &n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

// patchReplicaStatus reads a ModelReplica with c and patches its status as an agent
// does (merge patch with optimistic lock).
func patchReplicaStatus(ctx context.Context, c client.Client, ns, name string, mutate func(*v1alpha1.ModelReplica)) error {
	var r v1alpha1.ModelReplica
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
		return err
	}
	before := r.DeepCopy()
	mutate(&r)
	return c.Status().Patch(ctx, &r, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

// forget deletes, when the test ends, the MacNodes and node Leases of these names:
// they are cluster-wide (or in a shared namespace), unlike the test's namespace.
func forget(t *testing.T, names ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range names {
			for _, o := range []client.Object{&v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: n}}, newLease(v1alpha1.NodeLeaseNamespace, n)} {
				if err := env.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("deleting %T %s: %v", o, n, err)
				}
			}
		}
	})
}

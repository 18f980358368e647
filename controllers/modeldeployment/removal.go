package modeldeployment

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// startRemoval drains mr (one patch setting spec.drain) or deletes it at once, as
// decideRemoval says.
func (r *Reconciler) startRemoval(ctx context.Context, mr *v1alpha1.ModelReplica, now time.Time) error {
	up, err := r.replicaNodesReady(ctx, mr)
	if err != nil {
		return err
	}
	dec := decideRemoval(mr, up, now, r.DrainTimeout)
	if dec.Action != removalDrain {
		if err := r.Client.Delete(ctx, mr, client.Preconditions{UID: &mr.UID}); err != nil &&
			!apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting replica %s: %w", mr.Name, err)
		}
		log.FromContext(ctx).V(2).Info("Deleted a replica without draining it", "ModelReplica", klog.KObj(mr), "why", dec.Why)
		return nil
	}
	before := mr.DeepCopy()
	mr.Spec.Drain = &metav1.Time{Time: now}
	if err := r.Client.Patch(ctx, mr, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("draining replica %s: %w", mr.Name, err)
	}
	log.FromContext(ctx).Info("Draining a replica before deleting it", "ModelReplica", klog.KObj(mr), "MacNode", mr.Spec.NodeName)
	return nil
}

// endDrains deletes the draining replicas whose drain is over, with an Event on md,
// and returns how long the others may still take (0: none left).
func (r *Reconciler) endDrains(ctx context.Context, md *v1alpha1.ModelDeployment, draining []*v1alpha1.ModelReplica,
	now time.Time) (time.Duration, error) {
	var left time.Duration
	for _, mr := range draining {
		up, err := r.replicaNodesReady(ctx, mr)
		if err != nil {
			return 0, err
		}
		dec := decideRemoval(mr, up, now, r.DrainTimeout)
		if dec.Action == removalWait {
			left = minPositive(left, dec.Wait)
			continue
		}
		err = r.Client.Delete(ctx, mr, client.Preconditions{UID: &mr.UID})
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			continue // deleted already (a stale cache showed it again)
		case err != nil:
			return 0, fmt.Errorf("deleting drained replica %s: %w", mr.Name, err)
		}
		note := removedNote(mr, dec.Why, r.DrainTimeout)
		log.FromContext(ctx).Info("Deleted a draining replica", "ModelReplica", klog.KObj(mr), "why", dec.Why, "note", note)
		eventType := corev1.EventTypeNormal
		if dec.Why == removedTimedOut {
			eventType = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(md, mr, eventType, ReasonReplicaDrained, "Scale", "%s", note)
	}
	return left, nil
}

// nodeReady says whether the MacNode named node exists (in the cache) and is Ready.
func (r *Reconciler) nodeReady(ctx context.Context, node string) (bool, error) {
	if node == "" {
		return false, nil
	}
	mn := &v1alpha1.MacNode{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Name: node}, mn); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading MacNode %s: %w", node, err)
	}
	return mn.DeletionTimestamp == nil && meta.IsStatusConditionTrue(mn.Status.Conditions, v1alpha1.MacNodeReady), nil
}

// nodeChanged wakes the deployments with a replica draining on the MacNode, or split
// across Macs with a shard on it.
func (r *Reconciler) nodeChanged(ctx context.Context, obj client.Object) []ctrl.Request {
	var list v1alpha1.ModelReplicaList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "Listing replicas after a MacNode change", "MacNode", obj.GetName())
		return nil
	}
	var reqs []ctrl.Request
	for i := range list.Items {
		mr := &list.Items[i]
		owner := metav1.GetControllerOf(mr)
		if owner == nil || owner.Kind != "ModelDeployment" || !onNode(mr, obj.GetName()) ||
			(mr.Spec.Drain == nil && mr.Spec.Split == nil) {
			continue
		}
		reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: mr.Namespace, Name: owner.Name}})
	}
	return reqs
}

// nodeReadyChanged passes the MacNode events that may end a drain: deletions and
// changes of the Ready condition's status.
func nodeReadyChanged() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			a, b := e.ObjectOld.(*v1alpha1.MacNode), e.ObjectNew.(*v1alpha1.MacNode)
			return meta.IsStatusConditionTrue(a.Status.Conditions, v1alpha1.MacNodeReady) !=
				meta.IsStatusConditionTrue(b.Status.Conditions, v1alpha1.MacNodeReady) ||
				(a.DeletionTimestamp == nil) != (b.DeletionTimestamp == nil)
		},
	}
}

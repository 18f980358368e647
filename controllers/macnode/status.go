package macnode

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// setReadyUnknown sets node's Ready condition to Unknown with reason
// NodeLeaseExpired and message, touching no other condition. lastTransitionTime
// becomes now only when the status changes, so a node that is already Unknown keeps
// the start of its grace period. It reports whether the condition changed.
func setReadyUnknown(node *v1alpha1.MacNode, message string, now time.Time) bool {
	want := metav1.Condition{
		Type:               v1alpha1.MacNodeReady,
		Status:             metav1.ConditionUnknown,
		ObservedGeneration: node.Generation,
		LastTransitionTime: metav1.NewTime(now),
		Reason:             v1alpha1.ReasonLeaseExpired,
		Message:            message,
	}
	return meta.SetStatusCondition(&node.Status.Conditions, want)
}

// setReplicaUnreachable sets a replica's Ready condition to Unknown with reason
// NodeUnreachable, as the node lifecycle controller does for the Pods of a lost node:
// nobody else is left to say the replica no longer serves. It reports whether the
// condition changed (a replica already not Ready=True is left as it is).
func setReplicaUnreachable(mr *v1alpha1.ModelReplica, node string, now time.Time) bool {
	c := meta.FindStatusCondition(mr.Status.Conditions, v1alpha1.ReplicaReady)
	if c == nil || c.Status != metav1.ConditionTrue {
		return false
	}
	return meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{
		Type:               v1alpha1.ReplicaReady,
		Status:             metav1.ConditionUnknown,
		ObservedGeneration: mr.Generation,
		LastTransitionTime: metav1.NewTime(now),
		Reason:             v1alpha1.ReasonNodeUnreachable,
		Message:            "MacNode " + node + " stopped renewing its Lease; the replica's agent cannot be reached",
	})
}

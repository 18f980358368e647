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

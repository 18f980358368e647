package macnode

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/bytesize"
	"github.com/macfleet/macfleet/internal/ceiling"
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

// setCeilingCapped sets node's CeilingCapped condition to True when its agent reports
// a memory ceiling above what the scheduler believes (internal/ceiling.Node), naming
// the cap and the fix, and removes it otherwise. It reports whether it changed.
func setCeilingCapped(node *v1alpha1.MacNode, now time.Time) bool {
	c, ok := ceiling.Node(node)
	if !ok || c.Source == ceiling.SourceReported {
		return meta.RemoveStatusCondition(&node.Status.Conditions, v1alpha1.MacNodeCeilingCapped)
	}
	reported, capped := bytesize.Format(node.Status.Memory.Ceiling.Value()), bytesize.Format(c.Bytes)
	want := metav1.Condition{
		Type: v1alpha1.MacNodeCeilingCapped, Status: metav1.ConditionTrue, ObservedGeneration: node.Generation,
		LastTransitionTime: metav1.NewTime(now),
	}
	switch _, known := ceiling.ChipMemory(node.Status.Hardware.Chip); {
	case c.Source == ceiling.SourceMeasured:
		want.Reason = v1alpha1.ReasonMeasuredMemoryExceeded
		want.Message = fmt.Sprintf("the agent reports a memory ceiling of %s, more than the %s of unified memory it measured "+
			"(status.hardware.unifiedMemory, or the first it reported, status.effectiveCeiling.measuredMemory): replicas are "+
			"placed here for %s at most. A Mac's memory does not grow: if this MacNode's name now belongs to another Mac, "+
			"remove status.effectiveCeiling; set spec.memoryCeiling to bound this Mac exactly", reported, capped, capped)
	case c.Source == ceiling.SourceOperator:
		want.Reason = v1alpha1.ReasonOperatorCeilingExceeded
		want.Message = fmt.Sprintf("the agent reports a memory ceiling of %s, above spec.memoryCeiling %s: replicas are placed "+
			"here for %s at most. An agent lowers its ceiling to spec.memoryCeiling when it sees it; if this stays, the agent "+
			"does not (an old or modified agent): check the Mac", reported, capped, capped)
	case known:
		want.Reason = v1alpha1.ReasonChipMemoryExceeded
		want.Message = fmt.Sprintf("the agent reports a memory ceiling of %s, more than any %s has (%s of unified memory): "+
			"replicas are placed here for %s at most. If the agent's --chip or --unified-memory is wrong, fix it; set "+
			"spec.memoryCeiling to bound this Mac exactly", reported, node.Status.Hardware.Chip, capped, capped)
	default:
		want.Reason = v1alpha1.ReasonChipMemoryExceeded
		want.Message = fmt.Sprintf("the agent reports a memory ceiling of %s, more than any Mac macfleet knows has (%s), and "+
			"its chip %q is not one macfleet knows: replicas are placed here for %s at most. Set spec.memoryCeiling to this "+
			"Mac's real ceiling to bound it exactly", reported, capped, node.Status.Hardware.Chip, capped)
	}
	return meta.SetStatusCondition(&node.Status.Conditions, want)
}

// setEffectiveCeiling sets node's status.effectiveCeiling to what the scheduler
// believes of its memory (internal/ceiling.Node), which kubectl's Ceiling column and
// the console show, with the memory the agent first measured (kept from then on:
// ceiling.FirstMeasured), and removes it while the agent has reported no ceiling
// (keeping only the measured memory, once there is one). It reports whether it
// changed.
func setEffectiveCeiling(node *v1alpha1.MacNode) bool {
	var want *v1alpha1.EffectiveCeiling
	if c, ok := ceiling.Node(node); ok {
		want = &v1alpha1.EffectiveCeiling{Bytes: *resource.NewQuantity(c.Bytes, resource.BinarySI),
			Display: bytesize.Format(c.Bytes), Source: string(c.Source)}
	}
	// The measured memory is kept from the first report with a ceiling on, also while
	// the agent reports no ceiling (else a Mac could clear its ceiling, then claim more).
	if m := ceiling.FirstMeasured(node); m != nil {
		switch {
		case want != nil:
			want.MeasuredMemory = resource.NewQuantity(m.Value(), resource.BinarySI)
		case node.Status.EffectiveCeiling != nil && node.Status.EffectiveCeiling.MeasuredMemory != nil:
			want = &v1alpha1.EffectiveCeiling{MeasuredMemory: resource.NewQuantity(m.Value(), resource.BinarySI)}
		}
	}
	cur := node.Status.EffectiveCeiling
	if want == nil && cur == nil || want != nil && cur != nil && want.Bytes.Cmp(cur.Bytes) == 0 &&
		want.Display == cur.Display && want.Source == cur.Source && sameQuantity(want.MeasuredMemory, cur.MeasuredMemory) {
		return false
	}
	node.Status.EffectiveCeiling = want
	return true
}

// sameQuantity says whether a and b are both nil or equal.
func sameQuantity(a, b *resource.Quantity) bool {
	return a == nil && b == nil || a != nil && b != nil && a.Cmp(*b) == 0
}

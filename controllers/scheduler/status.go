package scheduler

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// boundCondition is the Scheduled condition of a replica bound to node.
func boundCondition(node string) metav1.Condition {
	return metav1.Condition{
		Type:    v1alpha1.ReplicaScheduled,
		Status:  metav1.ConditionTrue,
		Reason:  v1alpha1.ReasonBound,
		Message: fmt.Sprintf("Bound to %s", node),
	}
}

// unschedulableCondition is the Scheduled condition of a replica no node fits: the
// solver's reason code and kube-scheduler-style message.
func unschedulableCondition(reason Reason) metav1.Condition {
	return metav1.Condition{
		Type:    v1alpha1.ReplicaScheduled,
		Status:  metav1.ConditionFalse,
		Reason:  string(reason.Code),
		Message: reason.Message,
	}
}

// conditionSays reports whether cur already says what want says: same status,
// reason and message (timestamps and generations aside). A nil cur says nothing.
func conditionSays(cur *metav1.Condition, want metav1.Condition) bool {
	return cur != nil && cur.Status == want.Status && cur.Reason == want.Reason && cur.Message == want.Message
}

// setScheduledCondition sets the replica's Scheduled condition to want, observed at
// the replica's generation. The transition time moves to now only when the status
// changes. It reports whether the replica's conditions changed.
func setScheduledCondition(r *v1alpha1.ModelReplica, want metav1.Condition, now time.Time) bool {
	want.Type = v1alpha1.ReplicaScheduled
	want.ObservedGeneration = r.Generation
	want.LastTransitionTime = metav1.NewTime(now)
	return meta.SetStatusCondition(&r.Status.Conditions, want)
}

// write is one change to one replica: bind it to node (unless node is ""), then set
// its Scheduled condition to cond.
type write struct {
	// replica is the object the change is computed from; it is never modified.
	replica *v1alpha1.ModelReplica
	node    string
	cond    metav1.Condition
}

// plan turns a solve's result into writes:
//   - every binding: bind, then Scheduled=True reason Bound;
//   - every unplaceable replica whose Scheduled condition does not already carry the
//     solver's reason and message: Scheduled=False with them (so an unchanged verdict
//     costs no write, however often the fleet is solved);
//   - every bound replica whose Scheduled condition is not True (an earlier condition
//     write failed after its binding, or something else bound it): Scheduled=True.
//
// current returns a replica's Scheduled condition as the scheduler knows it.
// Bindings come first, in the solver's order.
func plan(v view, res Result, current func(*v1alpha1.ModelReplica) *metav1.Condition) []write {
	var ws []write
	for _, b := range res.Bindings {
		ws = append(ws, write{replica: v.pending[b.Replica], node: b.Node, cond: boundCondition(b.Node)})
	}
	for _, r := range v.snap.Pending {
		reason, ok := res.Unplaceable[r.Key]
		if !ok {
			continue
		}
		obj := v.pending[r.Key]
		if want := unschedulableCondition(reason); !conditionSays(current(obj), want) {
			ws = append(ws, write{replica: obj, cond: want})
		}
	}
	for _, b := range v.bound {
		if c := current(b.replica); c == nil || c.Status != metav1.ConditionTrue {
			ws = append(ws, write{replica: b.replica, cond: boundCondition(b.node)})
		}
	}
	return ws
}

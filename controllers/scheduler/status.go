package scheduler

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
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

// gangBoundCondition is the Scheduled condition of a replica bound as a gang, e.g.
// "Bound to 2 Macs: mac-a (head, layers 0-40), mac-b (layers 41-79)".
func gangBoundCondition(split *v1alpha1.ReplicaSplit) metav1.Condition {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Bound to %d Macs: ", len(split.Shards))
	for k, s := range split.Shards {
		if k > 0 {
			sb.WriteString(", ")
		}
		head := ""
		if k == 0 {
			head = "head, "
		}
		fmt.Fprintf(&sb, "%s (%slayers %d-%d)", s.Node, head, s.FirstLayer, s.LastLayer)
	}
	return metav1.Condition{
		Type:    v1alpha1.ReplicaScheduled,
		Status:  metav1.ConditionTrue,
		Reason:  v1alpha1.ReasonBound,
		Message: sb.String(),
	}
}

// bindingCondition is the Scheduled condition of a replica bound to node, as a gang
// when split is not nil.
func bindingCondition(node string, split *v1alpha1.ReplicaSplit) metav1.Condition {
	if split != nil {
		return gangBoundCondition(split)
	}
	return boundCondition(node)
}

// splitOf is the ModelReplica split of a gang binding's shards; nil for a binding to
// one node.
func splitOf(shards []Shard) *v1alpha1.ReplicaSplit {
	if len(shards) == 0 {
		return nil
	}
	split := &v1alpha1.ReplicaSplit{Shards: make([]v1alpha1.ReplicaShard, len(shards))}
	macs := make([]string, len(shards))
	layers := make([]string, len(shards))
	for k, s := range shards {
		split.Shards[k] = v1alpha1.ReplicaShard{Node: s.Node, FirstLayer: s.FirstLayer, LastLayer: s.LastLayer,
			Memory: *resource.NewQuantity(s.Memory, resource.BinarySI)}
		macs[k] = s.Node
		layers[k] = fmt.Sprintf("%d-%d", s.FirstLayer, s.LastLayer)
	}
	split.Macs, split.Layers = strings.Join(macs, ","), strings.Join(layers, ",")
	return split
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

// write is one change to one replica: bind it to node (unless node is "") and, for a
// gang, split, in one patch; then set its Scheduled condition to cond.
type write struct {
	// replica is the object the change is computed from; it is never modified.
	replica *v1alpha1.ModelReplica
	node    string
	split   *v1alpha1.ReplicaSplit
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
		split := splitOf(b.Shards)
		ws = append(ws, write{replica: v.pending[b.Replica], node: b.Node, split: split, cond: bindingCondition(b.Node, split)})
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
			ws = append(ws, write{replica: b.replica, cond: bindingCondition(b.node, b.split)})
		}
	}
	return ws
}

package macnode

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func lease(renew time.Time, seconds int32) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.NodeLeaseNamespace, Name: "mac-1"},
		Spec: coordinationv1.LeaseSpec{
			RenewTime:            &metav1.MicroTime{Time: renew},
			LeaseDurationSeconds: ptr.To(seconds),
		},
	}
}

func node(unschedulable bool, conds ...metav1.Condition) *v1alpha1.MacNode {
	return &v1alpha1.MacNode{
		ObjectMeta: metav1.ObjectMeta{Name: "mac-1"},
		Spec:       v1alpha1.MacNodeSpec{Unschedulable: unschedulable},
		Status:     v1alpha1.MacNodeStatus{Conditions: conds},
	}
}

func ready(status metav1.ConditionStatus, since time.Time) metav1.Condition {
	return metav1.Condition{Type: v1alpha1.MacNodeReady, Status: status, Reason: "R", LastTransitionTime: metav1.NewTime(since)}
}

func TestNodeLiveness(t *testing.T) {
	const grace = 60 * time.Second
	expiredMsg := "The agent stopped renewing Lease macfleet-node-lease/mac-1; it expired at 2026-03-01T12:00:40Z"
	tests := []struct {
		name  string
		lease *coordinationv1.Lease
		node  *v1alpha1.MacNode
		now   time.Time
		// contact: when the controller's unbroken contact with the API server began.
		contact time.Time
		want    liveness
	}{{
		name:  "live lease requeues at its exact expiry",
		lease: lease(t0, 40),
		node:  node(false, ready(metav1.ConditionTrue, t0)),
		now:   t0.Add(15 * time.Second),
		want:  liveness{requeueAfter: 25 * time.Second},
	}, {
		name:  "live lease with sub-second renewTime",
		lease: lease(t0.Add(1500*time.Microsecond), 40),
		node:  node(false, ready(metav1.ConditionTrue, t0)),
		now:   t0.Add(40 * time.Second),
		want:  liveness{requeueAfter: 1500 * time.Microsecond},
	}, {
		name:  "live lease leaves a Ready=Unknown node to its agent",
		lease: lease(t0.Add(70*time.Second), 40),
		node:  node(false, ready(metav1.ConditionUnknown, t0.Add(40*time.Second))),
		now:   t0.Add(80 * time.Second),
		want:  liveness{requeueAfter: 30 * time.Second},
	}, {
		name:  "expired exactly at renewTime+duration",
		lease: lease(t0, 40),
		node:  node(false, ready(metav1.ConditionTrue, t0)),
		now:   t0.Add(40 * time.Second),
		want:  liveness{ready: metav1.ConditionUnknown, message: expiredMsg, requeueAfter: grace},
	}, {
		name:  "expiry noticed late: grace starts now, when Ready turns Unknown",
		lease: lease(t0, 40),
		node:  node(false, ready(metav1.ConditionTrue, t0)),
		now:   t0.Add(100 * time.Second),
		want:  liveness{ready: metav1.ConditionUnknown, message: expiredMsg, requeueAfter: grace},
	}, {
		name:  "in grace: requeue at its end, counted from the Unknown transition",
		lease: lease(t0, 40),
		node:  node(false, ready(metav1.ConditionUnknown, t0.Add(40*time.Second))),
		now:   t0.Add(70 * time.Second),
		want:  liveness{ready: metav1.ConditionUnknown, message: expiredMsg, requeueAfter: 30 * time.Second},
	}, {
		name:  "grace over: delete replicas",
		lease: lease(t0, 40),
		node:  node(false, ready(metav1.ConditionUnknown, t0.Add(40*time.Second))),
		now:   t0.Add(100 * time.Second),
		want:  liveness{ready: metav1.ConditionUnknown, message: expiredMsg, deleteReplicas: true},
	}, {
		name:  "grace over long ago",
		lease: lease(t0, 40),
		node:  node(false, ready(metav1.ConditionUnknown, t0.Add(40*time.Second))),
		now:   t0.Add(time.Hour),
		want:  liveness{ready: metav1.ConditionUnknown, message: expiredMsg, deleteReplicas: true},
	}, {
		name:  "cordoned and lost: cordon does not protect a lost node",
		lease: lease(t0, 40),
		node:  node(true, ready(metav1.ConditionUnknown, t0.Add(40*time.Second))),
		now:   t0.Add(100 * time.Second),
		want:  liveness{ready: metav1.ConditionUnknown, message: expiredMsg, deleteReplicas: true},
	}, {
		name:  "cordoned and live: nothing to do",
		lease: lease(t0, 40),
		node:  node(true, ready(metav1.ConditionTrue, t0)),
		now:   t0.Add(39 * time.Second),
		want:  liveness{requeueAfter: time.Second},
	}, {
		name:  "renewed then expired again while still Unknown: grace restarts at the new expiry",
		lease: lease(t0, 40),
		node:  node(false, ready(metav1.ConditionUnknown, t0.Add(-50*time.Second))),
		now:   t0.Add(90 * time.Second),
		want:  liveness{ready: metav1.ConditionUnknown, message: expiredMsg, requeueAfter: 10 * time.Second},
	}, {
		name: "Unknown set by someone else long ago, lease missing: grace counted from that transition",
		node: node(false, ready(metav1.ConditionUnknown, t0)),
		now:  t0.Add(61 * time.Second),
		want: liveness{ready: metav1.ConditionUnknown, deleteReplicas: true,
			message: "Lease macfleet-node-lease/mac-1 does not exist: the agent has not started or cannot reach the API server"},
	}, {
		name: "no lease and no conditions yet (agent never started)",
		node: node(false),
		now:  t0,
		want: liveness{ready: metav1.ConditionUnknown, requeueAfter: grace,
			message: "Lease macfleet-node-lease/mac-1 does not exist: the agent has not started or cannot reach the API server"},
	}, {
		name:  "Ready=False (agent stopping) with a dead lease turns Unknown; grace starts now",
		lease: lease(t0, 40),
		node:  node(false, ready(metav1.ConditionFalse, t0)),
		now:   t0.Add(50 * time.Second),
		want:  liveness{ready: metav1.ConditionUnknown, message: expiredMsg, requeueAfter: grace},
	}, {
		name:  "lease never renewed",
		lease: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40)}},
		node:  node(false),
		now:   t0,
		want:  liveness{ready: metav1.ConditionUnknown, message: "Lease macfleet-node-lease/mac-1 has never been renewed", requeueAfter: grace},
	}, {
		name:  "lease without a duration expires at its renewTime",
		lease: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: t0}}},
		node:  node(false, ready(metav1.ConditionTrue, t0)),
		now:   t0,
		want: liveness{ready: metav1.ConditionUnknown, requeueAfter: grace,
			message: "The agent stopped renewing Lease macfleet-node-lease/mac-1; it expired at 2026-03-01T12:00:00Z"},
	}, {
		name:    "lease expired while the controller was cut off: live until a lease duration after contact",
		lease:   lease(t0, 40),
		node:    node(false, ready(metav1.ConditionTrue, t0)),
		now:     t0.Add(70 * time.Second),
		contact: t0.Add(60 * time.Second),
		want:    liveness{requeueAfter: 30 * time.Second},
	}, {
		name:    "controller cut off right now: every lease counts as live",
		lease:   lease(t0, 40),
		node:    node(false, ready(metav1.ConditionTrue, t0)),
		now:     t0.Add(500 * time.Second),
		contact: t0.Add(500 * time.Second),
		want:    liveness{requeueAfter: 40 * time.Second},
	}, {
		name:    "not renewed for a lease duration after contact: lost, grace from then",
		lease:   lease(t0, 40),
		node:    node(false, ready(metav1.ConditionTrue, t0)),
		now:     t0.Add(100 * time.Second),
		contact: t0.Add(60 * time.Second),
		want:    liveness{ready: metav1.ConditionUnknown, message: expiredMsg, requeueAfter: grace},
	}, {
		name:    "contact long before the lease's expiry changes nothing",
		lease:   lease(t0, 40),
		node:    node(false, ready(metav1.ConditionTrue, t0)),
		now:     t0.Add(50 * time.Second),
		contact: t0.Add(-time.Hour),
		want:    liveness{ready: metav1.ConditionUnknown, message: expiredMsg, requeueAfter: grace},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := nodeLiveness(tt.lease, tt.node, tt.now, tt.contact, grace)
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(liveness{})); diff != "" {
				t.Errorf("nodeLiveness (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNodeLivenessZeroGrace(t *testing.T) {
	got := nodeLiveness(lease(t0, 40), node(false, ready(metav1.ConditionTrue, t0)), t0.Add(40*time.Second), time.Time{}, 0)
	if !got.deleteReplicas || got.requeueAfter != 0 {
		t.Errorf("with no grace, an expired lease must delete at once: %+v", got)
	}
}

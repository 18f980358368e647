package scheduler

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

var (
	t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	t1 = t0.Add(time.Minute)
)

func withConditions(conds ...metav1.Condition) func(*v1alpha1.ModelReplica) {
	return func(r *v1alpha1.ModelReplica) { r.Status.Conditions = conds }
}

func TestSetScheduledCondition(t *testing.T) {
	insufficient := Reason{Code: ReasonInsufficientMemory, Message: "0/1 Macs fit: 1 insufficient memory (need 9.0GiB, largest free 8.0GiB)"}
	notReady := Reason{Code: ReasonNodeNotReady, Message: "0/1 Macs fit: 1 not ready"}
	at := func(c metav1.Condition, when time.Time, gen int64) metav1.Condition {
		c.LastTransitionTime, c.ObservedGeneration = metav1.NewTime(when), gen
		return c
	}
	loaded := metav1.Condition{Type: v1alpha1.ReplicaLoaded, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonRunnerReady, LastTransitionTime: metav1.NewTime(t0)}
	tests := []struct {
		name        string
		existing    []metav1.Condition
		want        metav1.Condition
		wantChanged bool
		wantConds   []metav1.Condition
	}{
		{
			name:        "first verdict",
			want:        unschedulableCondition(insufficient),
			wantChanged: true,
			wantConds:   []metav1.Condition{at(unschedulableCondition(insufficient), t1, 3)},
		},
		{
			name:      "same verdict again changes nothing",
			existing:  []metav1.Condition{at(unschedulableCondition(insufficient), t0, 3)},
			want:      unschedulableCondition(insufficient),
			wantConds: []metav1.Condition{at(unschedulableCondition(insufficient), t0, 3)},
		},
		{
			name:        "new reason keeps the transition time while still False",
			existing:    []metav1.Condition{at(unschedulableCondition(insufficient), t0, 3)},
			want:        unschedulableCondition(notReady),
			wantChanged: true,
			wantConds:   []metav1.Condition{at(unschedulableCondition(notReady), t0, 3)},
		},
		{
			name:        "bound after being unschedulable moves the transition time, other conditions stay",
			existing:    []metav1.Condition{loaded, at(unschedulableCondition(insufficient), t0, 3)},
			want:        boundCondition("mac-1"),
			wantChanged: true,
			wantConds:   []metav1.Condition{loaded, at(boundCondition("mac-1"), t1, 3)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := apiReplica("r", "d", 1, "", withConditions(tt.existing...))
			r.Generation = 3
			if got := setScheduledCondition(&r, tt.want, t1); got != tt.wantChanged {
				t.Errorf("changed = %v, want %v", got, tt.wantChanged)
			}
			if diff := cmp.Diff(tt.wantConds, r.Status.Conditions); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConditions(t *testing.T) {
	if got, want := boundCondition("mac-7"), (metav1.Condition{Type: "Scheduled", Status: "True", Reason: "Bound", Message: "Bound to mac-7"}); got != want {
		t.Errorf("boundCondition = %+v, want %+v", got, want)
	}
	r := Reason{Code: ReasonNodeCordoned, Message: "0/2 Macs fit: 2 cordoned"}
	if got, want := unschedulableCondition(r), (metav1.Condition{Type: "Scheduled", Status: "False", Reason: "NodeCordoned", Message: r.Message}); got != want {
		t.Errorf("unschedulableCondition = %+v, want %+v", got, want)
	}
}

func TestPlan(t *testing.T) {
	insufficient := Reason{Code: ReasonInsufficientMemory, Message: "0/1 Macs fit: 1 insufficient memory (need 9.0GiB, largest free 8.0GiB)"}
	cordonedReason := Reason{Code: ReasonNodeCordoned, Message: "0/1 Macs fit: 1 cordoned"}
	replicas := []v1alpha1.ModelReplica{
		apiReplica("new", "d", 1, ""),
		apiReplica("stuck", "d", 9, "", withConditions(unschedulableCondition(insufficient))),
		apiReplica("moved", "d", 9, "", withConditions(unschedulableCondition(insufficient))),
		apiReplica("fresh", "d", 9, ""),
		apiReplica("done", "d", 1, "a", withConditions(boundCondition("a"))),
		apiReplica("bare", "d", 1, "a"),
		apiReplica("stale", "d", 1, "a", withConditions(unschedulableCondition(insufficient))),
	}
	v := buildView([]v1alpha1.MacNode{apiNode("a", 16)}, replicas,
		[]v1alpha1.ModelDeployment{apiDeployment("d", v1alpha1.Placement{})}, nil)
	res := Result{
		Bindings: []Binding{{Replica: "ns/new", Node: "a"}},
		Unplaceable: map[string]Reason{
			"ns/stuck": insufficient,
			"ns/moved": cordonedReason,
			"ns/fresh": insufficient,
		},
	}
	type step struct{ Replica, Node, Status, Reason string }
	var got []step
	for _, w := range plan(v, res, func(r *v1alpha1.ModelReplica) *metav1.Condition {
		return meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled)
	}) {
		got = append(got, step{w.replica.Name, w.node, string(w.cond.Status), w.cond.Reason})
	}
	want := []step{
		{"new", "a", "True", "Bound"},
		{"moved", "", "False", "NodeCordoned"},
		{"fresh", "", "False", "InsufficientMemory"},
		{"bare", "", "True", "Bound"},
		{"stale", "", "True", "Bound"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("plan (-want +got):\n%s", diff)
	}
}

// TestLedger follows one replica through the ledger: seen, bound (the cache lagging),
// its condition written, then the cache catching up.
func TestLedger(t *testing.T) {
	var l ledger
	pending := apiReplica("r", "d", 1, "")
	cached := func() *metav1.Condition {
		return meta.FindStatusCondition(pending.Status.Conditions, v1alpha1.ReplicaScheduled)
	}

	if got := l.assumedNode(&pending); got != "" {
		t.Fatalf("assumedNode of an unknown replica = %q", got)
	}
	l.created(pending.UID, t0)
	if got := l.bound(pending.UID, "a"); !got.Equal(t0) {
		t.Errorf("bound returned first-seen %v, want %v", got, t0)
	}
	if got := l.bound(pending.UID, "a"); !got.IsZero() {
		t.Errorf("a second bound returned first-seen %v, want zero: latency is observed once", got)
	}
	if got := l.assumedNode(&pending); got != "a" {
		t.Errorf("assumedNode while the cache lags = %q, want a", got)
	}
	l.wrote(pending.UID, boundCondition("a"))
	if got := l.condition(&pending); !conditionSays(got, boundCondition("a")) {
		t.Errorf("condition while the cache lags = %+v, want the written one", got)
	}
	if cached() != nil {
		t.Fatal("the ledger modified the cached object")
	}

	// The cache shows the binding but not the condition yet.
	caught := pending.DeepCopy()
	caught.Spec.NodeName = "a"
	if got := l.assumedNode(caught); got != "" {
		t.Errorf("assumedNode once the cache shows the binding = %q, want empty", got)
	}
	if got := l.condition(caught); !conditionSays(got, boundCondition("a")) {
		t.Errorf("condition before the cache shows it = %+v, want the written one", got)
	}
	// The cache shows both: the entry is gone.
	caught.Status.Conditions = []metav1.Condition{boundCondition("a")}
	l.assumedNode(caught)
	if n := l.len(); n != 0 {
		t.Errorf("ledger holds %d entries once the cache caught up, want 0", n)
	}

	// Deletion forgets everything.
	l.created("other", t0)
	l.bound("other", "b")
	l.deleted("other")
	if n := l.len(); n != 0 {
		t.Errorf("ledger holds %d entries after deletion, want 0", n)
	}
}

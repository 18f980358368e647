package scheduler

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// in puts a replica in namespace ns (its key and deployment move there too).
func in(ns string, r Replica) Replica {
	r.Key = ns + r.Key[len("ns"):]
	r.Deployment = ns + r.Deployment[len("ns"):]
	r.Namespace = ns
	return r
}

// quotaReason is the reason of a replica of namespace ns needing need that the
// quota called name, allowing limit with used in use, holds back.
func quotaReason(ns, need, name, limit, used string) Reason {
	return Reason{Code: ReasonQuotaExceeded, Message: "namespace " + ns + " is out of fleet memory quota: the replica needs " + need +
		", FleetQuota " + name + " allows " + limit + " and " + used + " is in use; raise the FleetQuota's spec.memory or scale down a deployment in " + ns}
}

func quota(name string, limit, used float64) Quota {
	return Quota{Name: name, Limit: gb(limit), Used: gb(used)}
}

func TestSolveQuota(t *testing.T) {
	roomy := []Node{mac("a", 64, 0), mac("b", 64, 0)}
	tests := []struct {
		name    string
		nodes   []Node
		pending []Replica
		quotas  map[string]Quota
		want    []Binding
		// unplaceable maps replica keys to the reason expected.
		unplaceable map[string]Reason
	}{
		{
			name:    "within the quota",
			nodes:   roomy,
			pending: []Replica{resident("r1", "d", 8)},
			quotas:  map[string]Quota{"ns": quota("default", 16, 4)},
			want:    bindings("r1", "a"),
		},
		{
			name:    "exactly at the quota",
			nodes:   roomy,
			pending: []Replica{resident("r1", "d", 8)},
			quotas:  map[string]Quota{"ns": quota("default", 16, 8)},
			want:    bindings("r1", "a"),
		},
		{
			name:        "over the quota although the nodes have room",
			nodes:       roomy,
			pending:     []Replica{resident("r1", "d", 8)},
			quotas:      map[string]Quota{"ns": quota("team", 16, 12)},
			unplaceable: map[string]Reason{"ns/r1": quotaReason("ns", "8.0GiB", "team", "16.0GiB", "12.0GiB")},
		},
		{
			name:        "bindings of the same solve count: the third replica waits",
			nodes:       roomy,
			pending:     []Replica{resident("r1", "d", 8), resident("r2", "d", 8), resident("r3", "d", 8)},
			quotas:      map[string]Quota{"ns": quota("default", 20, 0)},
			want:        bindings("r1", "a", "r2", "b"),
			unplaceable: map[string]Reason{"ns/r3": quotaReason("ns", "8.0GiB", "default", "20.0GiB", "16.0GiB")},
		},
		{
			name:        "OnDemand replicas are charged too",
			nodes:       roomy,
			pending:     []Replica{onDemand("r1", "d", 8)},
			quotas:      map[string]Quota{"ns": quota("default", 4, 0)},
			unplaceable: map[string]Reason{"ns/r1": quotaReason("ns", "8.0GiB", "default", "4.0GiB", "0.0GiB")},
		},
		{
			name:        "a smaller replica still fits where a larger one does not",
			nodes:       roomy,
			pending:     []Replica{resident("big", "d", 12), resident("small", "e", 4)},
			quotas:      map[string]Quota{"ns": quota("default", 10, 2)},
			want:        bindings("small", "a"),
			unplaceable: map[string]Reason{"ns/big": quotaReason("ns", "12.0GiB", "default", "10.0GiB", "2.0GiB")},
		},
		{
			name:        "a zero quota places nothing, not even a replica of no memory",
			nodes:       roomy,
			pending:     []Replica{resident("r1", "d", 0)},
			quotas:      map[string]Quota{"ns": quota("none", 0, 1)},
			unplaceable: map[string]Reason{"ns/r1": quotaReason("ns", "0.0GiB", "none", "0.0GiB", "1.0GiB")},
		},
		{
			name:        "quotas are per namespace",
			nodes:       roomy,
			pending:     []Replica{in("team-a", resident("r1", "d", 8)), in("team-b", resident("r1", "d", 8)), in("team-c", resident("r1", "d", 8))},
			quotas:      map[string]Quota{"team-a": quota("default", 8, 0), "team-b": quota("default", 8, 4)},
			want:        []Binding{{Replica: "team-a/r1", Node: "a"}, {Replica: "team-c/r1", Node: "a"}},
			unplaceable: map[string]Reason{"team-b/r1": quotaReason("team-b", "8.0GiB", "default", "8.0GiB", "4.0GiB")},
		},
		{
			name:    "within the quota but no node fits: the node reason",
			nodes:   []Node{mac("a", 8, 0)},
			pending: []Replica{resident("r1", "d", 10)},
			quotas:  map[string]Quota{"ns": quota("default", 64, 0)},
			unplaceable: map[string]Reason{"ns/r1": {Code: ReasonInsufficientMemory,
				Message: "0/1 Macs fit: 1 insufficient memory (need 10.0GiB, largest free 8.0GiB)"}},
		},
		{
			name:    "a replica no node takes does not use the quota",
			nodes:   []Node{mac("a", 8, 0), mac("b", 64, 0)},
			pending: []Replica{selecting(resident("r1", "d", 10), "chip", "none"), resident("r2", "e", 10)},
			quotas:  map[string]Quota{"ns": quota("default", 10, 0)},
			want:    bindings("r2", "b"),
			unplaceable: map[string]Reason{"ns/r1": {Code: ReasonNodeSelectorMismatch,
				Message: "0/2 Macs fit: 2 node selector mismatch"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := Solve(Snapshot{Nodes: tt.nodes, Pending: tt.pending, Quotas: tt.quotas}, Options{})
			if diff := cmp.Diff(tt.want, res.Bindings, equateEmpty); diff != "" {
				t.Errorf("bindings (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.unplaceable, res.Unplaceable, equateEmpty); diff != "" {
				t.Errorf("unplaceable (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSolveLeavesSnapshotQuotasAlone(t *testing.T) {
	quotas := map[string]Quota{"ns": quota("default", 16, 0)}
	Solve(Snapshot{Nodes: []Node{mac("a", 64, 0)}, Pending: []Replica{resident("r1", "d", 8)}, Quotas: quotas}, Options{})
	if got := quotas["ns"]; got != quota("default", 16, 0) {
		t.Errorf("the snapshot's quota after Solve: %+v, want it unchanged", got)
	}
}

func TestExplainQuota(t *testing.T) {
	snap := Snapshot{Nodes: []Node{mac("a", 64, 0)}, Quotas: map[string]Quota{"ns": quota("default", 16, 12)}}
	if got := Explain(snap, resident("r", "d", 4)); got.Code != ReasonSchedulable {
		t.Errorf("Explain(4GiB) = %+v, want Schedulable", got)
	}
	if got := Explain(snap, resident("r", "d", 8)); got.Code != ReasonQuotaExceeded {
		t.Errorf("Explain(8GiB) = %+v, want QuotaExceeded", got)
	}
}

func apiQuota(ns, name string, memGiB float64, mutate ...func(*v1alpha1.FleetQuota)) v1alpha1.FleetQuota {
	fq := v1alpha1.FleetQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.FleetQuotaSpec{Memory: *qty(memGiB)}}
	for _, m := range mutate {
		m(&fq)
	}
	return fq
}

func TestQuotaSnapshot(t *testing.T) {
	inNamespace := func(ns string) func(*v1alpha1.ModelReplica) {
		return func(r *v1alpha1.ModelReplica) { r.Namespace = ns }
	}
	deleting := func(fq *v1alpha1.FleetQuota) { fq.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)} }
	tests := []struct {
		name     string
		quotas   []v1alpha1.FleetQuota
		replicas []v1alpha1.ModelReplica
		assumed  map[string]string
		want     map[string]Quota
	}{
		{name: "no quotas", replicas: []v1alpha1.ModelReplica{apiReplica("r1", "d", 4, "a")}},
		{
			name:   "bound replicas of the namespace count, of every residency; unbound ones do not",
			quotas: []v1alpha1.FleetQuota{apiQuota("ns", "default", 32)},
			replicas: []v1alpha1.ModelReplica{
				apiReplica("r1", "d", 4, "a"),
				apiReplica("r2", "d", 8, "b", residency(v1alpha1.ResidencyOnDemand)),
				apiReplica("r3", "d", 16, ""),
				apiReplica("r4", "d", 2, "a", inNamespace("other")),
			},
			want: map[string]Quota{"ns": {Name: "default", Limit: 32 * gi, Used: 12 * gi}},
		},
		{
			name:     "a binding the cache does not show yet counts",
			quotas:   []v1alpha1.FleetQuota{apiQuota("ns", "default", 32)},
			replicas: []v1alpha1.ModelReplica{apiReplica("r1", "d", 4, ""), apiReplica("r2", "d", 4, "")},
			assumed:  map[string]string{"r1": "a"},
			want:     map[string]Quota{"ns": {Name: "default", Limit: 32 * gi, Used: 4 * gi}},
		},
		{
			name: "the smallest of a namespace's quotas applies; one being deleted does not",
			quotas: []v1alpha1.FleetQuota{apiQuota("ns", "large", 64), apiQuota("ns", "small", 16),
				apiQuota("ns", "gone", 1, deleting), apiQuota("other", "default", 8)},
			replicas: []v1alpha1.ModelReplica{apiReplica("r1", "d", 4, "a")},
			want: map[string]Quota{"ns": {Name: "small", Limit: 16 * gi, Used: 4 * gi},
				"other": {Name: "default", Limit: 8 * gi}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := []v1alpha1.MacNode{apiNode("a", 64), apiNode("b", 64)}
			v := buildView(nodes, tt.replicas, nil, func(r *v1alpha1.ModelReplica) string { return tt.assumed[r.Name] })
			if diff := cmp.Diff(tt.want, quotaSnapshot(tt.quotas, v.bound), equateEmpty); diff != "" {
				t.Errorf("quotas (-want +got):\n%s", diff)
			}
		})
	}
}

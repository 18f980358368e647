package scheduler

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// The builders below make API objects for the pure tests; sizes are in GiB.

func qty(gib float64) *resource.Quantity {
	return resource.NewQuantity(int64(gib*float64(gi)), resource.BinarySI)
}

// apiNode is a MacNode whose agent reports Ready and a ceiling of ceilingGiB
// (no ceiling when ceilingGiB is 0).
func apiNode(name string, ceilingGiB float64, mutate ...func(*v1alpha1.MacNode)) v1alpha1.MacNode {
	n := v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if ceilingGiB > 0 {
		n.Status.Memory.Ceiling = qty(ceilingGiB)
	}
	n.Status.Conditions = []metav1.Condition{{Type: v1alpha1.MacNodeReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentReady}}
	for _, m := range mutate {
		m(&n)
	}
	return n
}

// apiReplica is a replica of deployment dep in namespace "ns", bound to node unless
// node is "".
func apiReplica(name, dep string, memGiB float64, node string, mutate ...func(*v1alpha1.ModelReplica)) v1alpha1.ModelReplica {
	r := v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			Labels: map[string]string{v1alpha1.LabelDeployment: dep},
		},
		Spec: v1alpha1.ModelReplicaSpec{MemoryReservation: *qty(memGiB), NodeName: node},
	}
	for _, m := range mutate {
		m(&r)
	}
	return r
}

func residency(res v1alpha1.Residency) func(*v1alpha1.ModelReplica) {
	return func(r *v1alpha1.ModelReplica) { r.Spec.Template.Residency = res }
}

func apiDeployment(name string, placement v1alpha1.Placement) v1alpha1.ModelDeployment {
	return v1alpha1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
		Spec:       v1alpha1.ModelDeploymentSpec{Placement: placement},
	}
}

func deleting[T interface{ SetDeletionTimestamp(*metav1.Time) }](o T) {
	o.SetDeletionTimestamp(ptr.To(metav1.Now()))
}

func TestSolverNode(t *testing.T) {
	tests := []struct {
		name string
		node v1alpha1.MacNode
		want Node
	}{
		{
			name: "ready with a ceiling",
			node: apiNode("a", 32, func(n *v1alpha1.MacNode) { n.Labels = map[string]string{"chip": "M2"} }),
			want: Node{Name: "a", Labels: map[string]string{"chip": "M2"}, Ready: true, Ceiling: 32 * gi},
		},
		{
			name: "no ceiling reported yet is not ready",
			node: apiNode("a", 0),
			want: Node{Name: "a"},
		},
		{
			name: "Ready False",
			node: apiNode("a", 32, func(n *v1alpha1.MacNode) { n.Status.Conditions[0].Status = metav1.ConditionFalse }),
			want: Node{Name: "a", Ceiling: 32 * gi},
		},
		{
			name: "Ready Unknown (lease expired)",
			node: apiNode("a", 32, func(n *v1alpha1.MacNode) { n.Status.Conditions[0].Status = metav1.ConditionUnknown }),
			want: Node{Name: "a", Ceiling: 32 * gi},
		},
		{
			name: "no Ready condition",
			node: apiNode("a", 32, func(n *v1alpha1.MacNode) { n.Status.Conditions = nil }),
			want: Node{Name: "a", Ceiling: 32 * gi},
		},
		{
			name: "spec ceiling lower than the agent's wins",
			node: apiNode("a", 32, func(n *v1alpha1.MacNode) { n.Spec.MemoryCeiling = qty(8) }),
			want: Node{Name: "a", Ready: true, Ceiling: 8 * gi},
		},
		{
			name: "spec ceiling higher than the agent's is ignored",
			node: apiNode("a", 32, func(n *v1alpha1.MacNode) { n.Spec.MemoryCeiling = qty(64) }),
			want: Node{Name: "a", Ready: true, Ceiling: 32 * gi},
		},
		{
			name: "spec ceiling without the agent's is not ready",
			node: apiNode("a", 0, func(n *v1alpha1.MacNode) { n.Spec.MemoryCeiling = qty(8) }),
			want: Node{Name: "a"},
		},
		{
			name: "a ceiling beyond the chip's largest memory is capped by it",
			node: apiNode("a", 1024, func(n *v1alpha1.MacNode) { n.Status.Hardware.Chip = "Apple M4" }),
			want: Node{Name: "a", Ready: true, Ceiling: 32 * gi},
		},
		{
			name: "an unknown chip is capped by the largest Mac there is",
			node: apiNode("a", 4096, func(n *v1alpha1.MacNode) { n.Status.Hardware.Chip = "Apple M9 Hyper" }),
			want: Node{Name: "a", Ready: true, Ceiling: 512 * gi},
		},
		{
			name: "the operator's bound caps below the chip's",
			node: apiNode("a", 1024, func(n *v1alpha1.MacNode) {
				n.Status.Hardware.Chip = "Apple M3 Ultra"
				n.Spec.MemoryCeiling = qty(100)
			}),
			want: Node{Name: "a", Ready: true, Ceiling: 100 * gi},
		},
		{
			name: "the agent's own memory",
			node: apiNode("a", 32, func(n *v1alpha1.MacNode) { n.Status.Memory.Agent = resource.NewQuantity(60<<20, resource.BinarySI) }),
			want: Node{Name: "a", Ready: true, Ceiling: 32 * gi, Agent: 60 << 20},
		},
		{
			name: "cordoned",
			node: apiNode("a", 32, func(n *v1alpha1.MacNode) { n.Spec.Unschedulable = true }),
			want: Node{Name: "a", Ready: true, Unschedulable: true, Ceiling: 32 * gi},
		},
		{
			name: "being deleted is not ready",
			node: apiNode("a", 32, func(n *v1alpha1.MacNode) { deleting(n) }),
			want: Node{Name: "a", Ceiling: 32 * gi},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, solverNode(&tt.node)); diff != "" {
				t.Errorf("solverNode (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNodeChanged(t *testing.T) {
	base := apiNode("a", 32, func(n *v1alpha1.MacNode) { n.Labels = map[string]string{"chip": "M2"} })
	tests := []struct {
		name   string
		mutate func(*v1alpha1.MacNode)
		want   bool
	}{
		{"used memory and agent version", func(n *v1alpha1.MacNode) {
			n.Status.Memory.Used = qty(3)
			n.Status.Agent.Version = "v2"
		}, false},
		// It drifts with every measurement; each solve reads the latest.
		{"the agent's own memory", func(n *v1alpha1.MacNode) { n.Status.Memory.Agent = qty(1) }, false},
		{"ready lost", func(n *v1alpha1.MacNode) { n.Status.Conditions[0].Status = metav1.ConditionUnknown }, true},
		{"cordoned", func(n *v1alpha1.MacNode) { n.Spec.Unschedulable = true }, true},
		{"ceiling", func(n *v1alpha1.MacNode) { n.Status.Memory.Ceiling = qty(30) }, true},
		{"spec ceiling", func(n *v1alpha1.MacNode) { n.Spec.MemoryCeiling = qty(16) }, true},
		{"labels", func(n *v1alpha1.MacNode) { n.Labels = map[string]string{"chip": "M4"} }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur := base.DeepCopy()
			tt.mutate(cur)
			if got := nodeChanged(&base, cur); got != tt.want {
				t.Errorf("nodeChanged = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBuildView(t *testing.T) {
	binpack2 := v1alpha1.Placement{Strategy: v1alpha1.BinPack, MaxReplicasPerNode: 2}
	spreadSel := v1alpha1.Placement{Strategy: v1alpha1.Spread, NodeSelector: map[string]string{"chip": "M4"}}
	tests := []struct {
		name        string
		nodes       []v1alpha1.MacNode
		replicas    []v1alpha1.ModelReplica
		deployments []v1alpha1.ModelDeployment
		// assumed maps replica names to nodes the ledger says they are bound to.
		assumed     map[string]string
		want        Snapshot
		wantBound   map[string]string // replica name → node
		wantOrphans []string
	}{
		{
			name:  "reserving bound replicas commit memory, every bound replica counts",
			nodes: []v1alpha1.MacNode{apiNode("a", 64), apiNode("b", 32)},
			replicas: []v1alpha1.ModelReplica{
				apiReplica("r1", "d1", 4, "a"),
				apiReplica("r2", "d1", 2, "a", residency(v1alpha1.ResidencyPinned)),
				apiReplica("r3", "d2", 8, "a", residency(v1alpha1.ResidencyOnDemand)),
				apiReplica("r4", "d2", 1, "b", residency(v1alpha1.ResidencyResident)),
				// Bound to a node that is gone: counted nowhere.
				apiReplica("r5", "d2", 1, "gone"),
				// Being deleted but still holding its memory.
				apiReplica("r6", "d1", 3, "b", func(r *v1alpha1.ModelReplica) { deleting(r) }),
			},
			want: Snapshot{Nodes: []Node{
				{Name: "a", Ready: true, Ceiling: 64 * gi, Committed: 6 * gi, ReplicasByDeployment: map[string]int{"ns/d1": 2, "ns/d2": 1}},
				{Name: "b", Ready: true, Ceiling: 32 * gi, Committed: 4 * gi, ReplicasByDeployment: map[string]int{"ns/d2": 1, "ns/d1": 1}},
			}},
			wantBound: map[string]string{"r1": "a", "r2": "a", "r3": "a", "r4": "b", "r5": "gone", "r6": "b"},
		},
		{
			name:        "pending replicas take their placement from their deployment",
			nodes:       []v1alpha1.MacNode{apiNode("a", 64)},
			deployments: []v1alpha1.ModelDeployment{apiDeployment("d1", binpack2), apiDeployment("d2", spreadSel)},
			replicas: []v1alpha1.ModelReplica{
				apiReplica("p1", "d1", 4, ""),
				apiReplica("p2", "d2", 8, "", residency(v1alpha1.ResidencyOnDemand)),
				// Owned by d1 but not labelled: the controller reference names it.
				apiReplica("p3", "", 2, "", func(r *v1alpha1.ModelReplica) {
					r.Labels = nil
					r.OwnerReferences = []metav1.OwnerReference{{
						APIVersion: v1alpha1.GroupVersion.String(), Kind: "ModelDeployment", Name: "d1", Controller: ptr.To(true),
					}}
				}),
			},
			want: Snapshot{
				Nodes: []Node{{Name: "a", Ready: true, Ceiling: 64 * gi}},
				Pending: []Replica{
					{Key: "ns/p1", Namespace: "ns", Deployment: "ns/d1", Memory: 4 * gi, Reserves: true, Strategy: BinPack, MaxPerNode: 2},
					{Key: "ns/p2", Namespace: "ns", Deployment: "ns/d2", Memory: 8 * gi, NodeSelector: map[string]string{"chip": "M4"}, Strategy: Spread},
					{Key: "ns/p3", Namespace: "ns", Deployment: "ns/d1", Memory: 2 * gi, Reserves: true, Strategy: BinPack, MaxPerNode: 2},
				},
			},
		},
		{
			name:  "replicas of unknown or deleted deployments are orphans, deleting ones are left out",
			nodes: []v1alpha1.MacNode{apiNode("a", 64)},
			deployments: []v1alpha1.ModelDeployment{
				apiDeployment("d1", binpack2),
				func() v1alpha1.ModelDeployment { d := apiDeployment("gone", binpack2); deleting(&d); return d }(),
			},
			replicas: []v1alpha1.ModelReplica{
				apiReplica("o1", "missing", 4, ""),
				apiReplica("o2", "gone", 4, ""),
				apiReplica("o3", "", 4, "", func(r *v1alpha1.ModelReplica) { r.Labels = nil }),
				apiReplica("x", "d1", 4, "", func(r *v1alpha1.ModelReplica) { deleting(r) }),
			},
			want:        Snapshot{Nodes: []Node{{Name: "a", Ready: true, Ceiling: 64 * gi}}},
			wantOrphans: []string{"o1", "o2", "o3"},
		},
		{
			name:        "a binding the cache does not show yet counts as bound",
			nodes:       []v1alpha1.MacNode{apiNode("a", 64)},
			deployments: []v1alpha1.ModelDeployment{apiDeployment("d1", binpack2)},
			replicas:    []v1alpha1.ModelReplica{apiReplica("r1", "d1", 4, ""), apiReplica("r2", "d1", 4, "")},
			assumed:     map[string]string{"r1": "a"},
			want: Snapshot{
				Nodes:   []Node{{Name: "a", Ready: true, Ceiling: 64 * gi, Committed: 4 * gi, ReplicasByDeployment: map[string]int{"ns/d1": 1}}},
				Pending: []Replica{{Key: "ns/r2", Namespace: "ns", Deployment: "ns/d1", Memory: 4 * gi, Reserves: true, Strategy: BinPack, MaxPerNode: 2}},
			},
			wantBound: map[string]string{"r1": "a"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := buildView(tt.nodes, tt.replicas, tt.deployments, func(r *v1alpha1.ModelReplica) string { return tt.assumed[r.Name] })
			if diff := cmp.Diff(tt.want, v.snap, equateEmpty); diff != "" {
				t.Errorf("snapshot (-want +got):\n%s", diff)
			}
			bound := map[string]string{}
			for _, b := range v.bound {
				bound[b.replica.Name] = b.node
			}
			if diff := cmp.Diff(tt.wantBound, bound, equateEmpty); diff != "" {
				t.Errorf("bound (-want +got):\n%s", diff)
			}
			var orphans []string
			for _, o := range v.orphans {
				orphans = append(orphans, o.Name)
			}
			if diff := cmp.Diff(tt.wantOrphans, orphans, equateEmpty); diff != "" {
				t.Errorf("orphans (-want +got):\n%s", diff)
			}
			for _, p := range tt.want.Pending {
				if v.pending[p.Key] == nil {
					t.Errorf("pending[%s] has no object", p.Key)
				}
			}
		})
	}
}

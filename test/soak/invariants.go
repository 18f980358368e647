package soak

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// Snapshot is the fleet's state at the end of a soak: its objects and the runner
// processes on its Macs.
type Snapshot struct {
	Deployments []v1alpha1.ModelDeployment
	Replicas    []v1alpha1.ModelReplica
	Nodes       []v1alpha1.MacNode
	Runners     []RunnerProcess
}

// RunnerProcess is a running runner process and the Mac whose agent started it.
type RunnerProcess struct {
	PID  int
	Node string
}

// Check returns the invariants a converged fleet breaks, nil when it holds them all:
//   - every deployment is Ready: the manager observed its latest generation and
//     reports as many ready replicas as it asks for, each existing and Ready;
//   - no leaked reservations: every replica belongs to an existing deployment and is
//     bound to an existing, Ready Mac, and no deployment has more replicas than it asks for;
//   - no orphan runners: each Mac runs exactly one runner per replica its agent
//     reports Loaded there;
//   - each Mac's committed memory is the sum of the reservations of those replicas.
func Check(s Snapshot) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	nodes := map[string]*v1alpha1.MacNode{}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		nodes[n.Name] = n
		if !meta.IsStatusConditionTrue(n.Status.Conditions, v1alpha1.MacNodeReady) {
			bad("MacNode %s is not Ready", n.Name)
		}
	}
	byDeployment := map[string][]*v1alpha1.ModelReplica{}
	loaded := map[string][]*v1alpha1.ModelReplica{}
	for i := range s.Replicas {
		r := &s.Replicas[i]
		key := r.Namespace + "/" + r.Labels[v1alpha1.LabelDeployment]
		byDeployment[key] = append(byDeployment[key], r)
		if r.Spec.NodeName == "" {
			bad("replica %s/%s is not bound to a Mac", r.Namespace, r.Name)
		} else if nodes[r.Spec.NodeName] == nil {
			bad("replica %s/%s is bound to %s, which does not exist", r.Namespace, r.Name, r.Spec.NodeName)
		}
		if meta.IsStatusConditionTrue(r.Status.Conditions, v1alpha1.ReplicaLoaded) {
			loaded[r.Spec.NodeName] = append(loaded[r.Spec.NodeName], r)
		}
	}

	deployments := map[string]bool{}
	for _, md := range s.Deployments {
		key := md.Namespace + "/" + md.Name
		deployments[key] = true
		want := int32(1)
		if md.Spec.Replicas != nil {
			want = *md.Spec.Replicas
		}
		if md.Status.ObservedGeneration != md.Generation {
			bad("deployment %s: the manager observed generation %d of %d", key, md.Status.ObservedGeneration, md.Generation)
		}
		if md.Status.ReadyReplicas != want {
			bad("deployment %s has %d ready replicas, wants %d", key, md.Status.ReadyReplicas, want)
		}
		rs := byDeployment[key]
		if int32(len(rs)) != want {
			bad("deployment %s has %d replicas, wants %d", key, len(rs), want)
		}
		for _, r := range rs {
			if !meta.IsStatusConditionTrue(r.Status.Conditions, v1alpha1.ReplicaReady) {
				bad("replica %s/%s of deployment %s is not Ready", r.Namespace, r.Name, key)
			}
		}
	}
	for _, key := range sortedKeys(byDeployment) {
		if !deployments[key] {
			bad("%d replicas of deployment %s, which does not exist", len(byDeployment[key]), key)
		}
	}

	runners := map[string]int{}
	for _, p := range s.Runners {
		runners[p.Node]++
	}
	for _, name := range sortedKeys(runners) {
		if nodes[name] == nil {
			bad("%d runners of Mac %s, which does not exist", runners[name], name)
		}
	}
	for _, name := range sortedKeys(nodes) {
		if got, want := runners[name], len(loaded[name]); got != want {
			bad("Mac %s runs %d runners for %d Loaded replicas", name, got, want)
		}
		var sum resource.Quantity
		for _, r := range loaded[name] {
			sum.Add(r.Spec.MemoryReservation)
		}
		committed := nodes[name].Status.Memory.Committed
		if committed == nil {
			committed = &resource.Quantity{}
		}
		if committed.Cmp(sum) != 0 {
			bad("Mac %s has %s committed, its Loaded replicas reserve %s", name, committed, &sum)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

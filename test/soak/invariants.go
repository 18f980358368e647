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
	c := &checker{nodes: map[string]*v1alpha1.MacNode{}, byDeployment: map[string][]*v1alpha1.ModelReplica{},
		loaded: map[string][]*v1alpha1.ModelReplica{}}
	c.checkNodes(s.Nodes)
	c.checkReplicas(s.Replicas)
	c.checkDeployments(s.Deployments)
	c.checkRunners(s.Runners)
	return c.out
}

// checker gathers the invariants a snapshot breaks, in the order Check looks at
// them, with the indexes of the snapshot that the later checks read.
type checker struct {
	out []string
	// nodes by name; byDeployment: replicas by "<namespace>/<deployment>"; loaded:
	// the Loaded replicas by the Mac they are bound to.
	nodes        map[string]*v1alpha1.MacNode
	byDeployment map[string][]*v1alpha1.ModelReplica
	loaded       map[string][]*v1alpha1.ModelReplica
}

func (c *checker) bad(format string, args ...any) {
	c.out = append(c.out, fmt.Sprintf(format, args...))
}

// checkNodes indexes the Macs: each must be Ready.
func (c *checker) checkNodes(nodes []v1alpha1.MacNode) {
	for i := range nodes {
		n := &nodes[i]
		c.nodes[n.Name] = n
		if !meta.IsStatusConditionTrue(n.Status.Conditions, v1alpha1.MacNodeReady) {
			c.bad("MacNode %s is not Ready", n.Name)
		}
	}
}

// checkReplicas indexes the replicas: each must be bound to an existing Mac.
func (c *checker) checkReplicas(replicas []v1alpha1.ModelReplica) {
	for i := range replicas {
		r := &replicas[i]
		key := r.Namespace + "/" + r.Labels[v1alpha1.LabelDeployment]
		c.byDeployment[key] = append(c.byDeployment[key], r)
		if r.Spec.NodeName == "" {
			c.bad("replica %s/%s is not bound to a Mac", r.Namespace, r.Name)
		} else if c.nodes[r.Spec.NodeName] == nil {
			c.bad("replica %s/%s is bound to %s, which does not exist", r.Namespace, r.Name, r.Spec.NodeName)
		}
		if meta.IsStatusConditionTrue(r.Status.Conditions, v1alpha1.ReplicaLoaded) {
			c.loaded[r.Spec.NodeName] = append(c.loaded[r.Spec.NodeName], r)
		}
	}
}

// checkDeployments checks that each deployment is observed and Ready with as many
// Ready replicas as it asks for, and that no replica belongs to a missing one.
func (c *checker) checkDeployments(deps []v1alpha1.ModelDeployment) {
	deployments := map[string]bool{}
	for _, md := range deps {
		key := md.Namespace + "/" + md.Name
		deployments[key] = true
		want := int32(1)
		if md.Spec.Replicas != nil {
			want = *md.Spec.Replicas
		}
		if md.Status.ObservedGeneration != md.Generation {
			c.bad("deployment %s: the manager observed generation %d of %d", key, md.Status.ObservedGeneration, md.Generation)
		}
		if md.Status.ReadyReplicas != want {
			c.bad("deployment %s has %d ready replicas, wants %d", key, md.Status.ReadyReplicas, want)
		}
		rs := c.byDeployment[key]
		if int32(len(rs)) != want {
			c.bad("deployment %s has %d replicas, wants %d", key, len(rs), want)
		}
		for _, r := range rs {
			if !meta.IsStatusConditionTrue(r.Status.Conditions, v1alpha1.ReplicaReady) {
				c.bad("replica %s/%s of deployment %s is not Ready", r.Namespace, r.Name, key)
			}
		}
	}
	for _, key := range sortedKeys(c.byDeployment) {
		if !deployments[key] {
			c.bad("%d replicas of deployment %s, which does not exist", len(c.byDeployment[key]), key)
		}
	}
}

// checkRunners checks that each existing Mac runs one runner per Loaded replica and
// has their reservations committed, and that no runner runs on a missing Mac.
func (c *checker) checkRunners(procs []RunnerProcess) {
	runners := map[string]int{}
	for _, p := range procs {
		runners[p.Node]++
	}
	for _, name := range sortedKeys(runners) {
		if c.nodes[name] == nil {
			c.bad("%d runners of Mac %s, which does not exist", runners[name], name)
		}
	}
	for _, name := range sortedKeys(c.nodes) {
		if got, want := runners[name], len(c.loaded[name]); got != want {
			c.bad("Mac %s runs %d runners for %d Loaded replicas", name, got, want)
		}
		var sum resource.Quantity
		for _, r := range c.loaded[name] {
			sum.Add(r.Spec.MemoryReservation)
		}
		committed := c.nodes[name].Status.Memory.Committed
		if committed == nil {
			committed = &resource.Quantity{}
		}
		if committed.Cmp(sum) != 0 {
			c.bad("Mac %s has %s committed, its Loaded replicas reserve %s", name, committed, &sum)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

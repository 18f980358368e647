package scheduler

import (
	"maps"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ceiling"
)

// view is the fleet as one solve sees it: the solver's input and, to write the result
// back, the objects behind it. It only points into the objects it was built from and
// never changes them (they may be the cache's own).
type view struct {
	snap Snapshot
	// pending maps each pending replica's key (namespace/name) to its object.
	pending map[string]*v1alpha1.ModelReplica
	// bound are the bound replicas, in input order.
	bound []boundReplica
	// orphans are unbound replicas left out of the solve because their deployment is
	// not known (not in the cache yet, or being deleted).
	orphans []*v1alpha1.ModelReplica
}

// boundReplica is a replica and the node it is bound to (the head's, for a split
// replica, whose shards split lists).
type boundReplica struct {
	replica *v1alpha1.ModelReplica
	node    string
	split   *v1alpha1.ReplicaSplit
}

// assumedFunc returns the binding the scheduler wrote for a replica that its cache
// does not show yet: the node ("" if none) and, for a gang, its split.
type assumedFunc func(*v1alpha1.ModelReplica) (string, *v1alpha1.ReplicaSplit)

// buildView maps the cached MacNodes, ModelReplicas and ModelDeployments to a solver
// snapshot.
//
// A replica is bound when its spec.nodeName is set, or when assumed returns a node for
// it: a binding this scheduler wrote that the cache does not show yet. Bound replicas
// count towards their node's per-deployment replicas, and reserving ones (Resident,
// Pinned) towards its Committed memory; a split replica counts on each of its
// shards' nodes, with the shard's memory. Unbound replicas that are not being deleted
// are pending, with their placement taken from the deployment named by their
// macfleet.dev/deployment label; those whose deployment is unknown are orphans.
func buildView(nodes []v1alpha1.MacNode, replicas []v1alpha1.ModelReplica, deployments []v1alpha1.ModelDeployment,
	assumed func(*v1alpha1.ModelReplica) string) view {
	var both assumedFunc
	if assumed != nil {
		both = func(r *v1alpha1.ModelReplica) (string, *v1alpha1.ReplicaSplit) { return assumed(r), nil }
	}
	return buildGangView(nodes, replicas, deployments, both)
}

// buildGangView is buildView with assumed gang bindings: their shards count on their
// nodes before the cache shows them.
func buildGangView(nodes []v1alpha1.MacNode, replicas []v1alpha1.ModelReplica, deployments []v1alpha1.ModelDeployment,
	assumed assumedFunc) view {
	v := view{
		snap:    Snapshot{Nodes: make([]Node, len(nodes))},
		pending: make(map[string]*v1alpha1.ModelReplica),
	}
	index := make(map[string]*Node, len(nodes))
	for i := range nodes {
		v.snap.Nodes[i] = solverNode(&nodes[i])
		index[nodes[i].Name] = &v.snap.Nodes[i]
	}
	deps := make(map[string]*v1alpha1.ModelDeployment, len(deployments))
	for i := range deployments {
		if d := &deployments[i]; d.DeletionTimestamp == nil {
			deps[d.Namespace+"/"+d.Name] = d
		}
	}

	for i := range replicas {
		r := &replicas[i]
		node, split := r.Spec.NodeName, r.Spec.Split
		if node == "" && assumed != nil {
			node, split = assumed(r)
		}
		dep := deploymentKey(r)
		if node != "" {
			v.bound = append(v.bound, boundReplica{replica: r, node: node, split: split})
			if split == nil {
				countOn(index[node], dep, r, r.Spec.MemoryReservation.Value())
				continue
			}
			for _, s := range split.Shards {
				countOn(index[s.Node], dep, r, s.Memory.Value())
			}
			continue
		}
		if r.DeletionTimestamp != nil {
			continue
		}
		d := deps[dep]
		if d == nil {
			v.orphans = append(v.orphans, r)
			continue
		}
		key := r.Namespace + "/" + r.Name
		v.pending[key] = r
		v.snap.Pending = append(v.snap.Pending, Replica{
			Key:          key,
			Namespace:    r.Namespace,
			Deployment:   dep,
			Memory:       r.Spec.MemoryReservation.Value(),
			Reserves:     reserves(r),
			NodeSelector: d.Spec.Placement.NodeSelector,
			Strategy:     Strategy(d.Spec.Placement.Strategy),
			MaxPerNode:   int(d.Spec.Placement.MaxReplicasPerNode),
			MaxNodes:     int(d.Spec.Placement.MaxMacsPerReplica),
			Layers:       layerModel(r.Spec.LayerMemory),
		})
	}
	return v
}

// countOn counts replica r of deployment dep (its shard of mem bytes) on node n, if
// the node is known.
func countOn(n *Node, dep string, r *v1alpha1.ModelReplica, mem int64) {
	if n == nil {
		return
	}
	if reserves(r) {
		n.Committed += mem
	}
	if dep != "" {
		if n.ReplicasByDeployment == nil {
			n.ReplicasByDeployment = make(map[string]int)
		}
		n.ReplicasByDeployment[dep]++
	}
}

// layerModel maps a replica's layerMemory to the solver's; nil is the zero model
// (not splittable).
func layerModel(lm *v1alpha1.LayerMemory) LayerModel {
	if lm == nil {
		return LayerModel{}
	}
	return LayerModel{Layers: lm.Layers, PerLayer: lm.PerLayer.Value(), Head: lm.Head.Value(), Worker: lm.Worker.Value()}
}

// linkBandwidth is the node's link speed in bits per second: spec.link (the
// operator's) if set, else status.link (the agent's), else 0.
func linkBandwidth(mn *v1alpha1.MacNode) int64 {
	for _, l := range []*v1alpha1.Link{mn.Spec.Link, mn.Status.Link} {
		if l != nil && l.Bandwidth != nil && l.Bandwidth.Sign() > 0 {
			return l.Bandwidth.Value()
		}
	}
	return 0
}

// solverNode maps a MacNode to the solver's Node, without the bound replicas
// (Committed, ReplicasByDeployment). A node is Ready when its Ready condition is True,
// its agent has reported a memory ceiling and it is not being deleted.
func solverNode(mn *v1alpha1.MacNode) Node {
	bytes, ok := nodeCeiling(mn)
	return Node{
		Name:          mn.Name,
		Labels:        mn.Labels,
		Ready:         ok && mn.DeletionTimestamp == nil && meta.IsStatusConditionTrue(mn.Status.Conditions, v1alpha1.MacNodeReady),
		Unschedulable: mn.Spec.Unschedulable,
		Ceiling:       bytes,
		Agent:         agentMemory(mn),
		LinkBandwidth: linkBandwidth(mn),
	}
}

// agentMemory is the memory the node's agent reports using itself
// (status.memory.agent), 0 if it reports none.
func agentMemory(mn *v1alpha1.MacNode) int64 {
	if q := mn.Status.Memory.Agent; q != nil {
		return max(q.Value(), 0)
	}
	return 0
}

// nodeCeiling is the memory a node may give to models (internal/ceiling.Node): the
// ceiling its agent reports (status.memory.ceiling), believed only up to
// spec.memoryCeiling, the memory its agent measured and the largest memory of its
// chip, so that a Mac that claims
// more attracts no more replicas. ok is false while the agent has reported no ceiling.
func nodeCeiling(mn *v1alpha1.MacNode) (int64, bool) {
	c, ok := ceiling.Node(mn)
	return c.Bytes, ok
}

// nodeChanged reports whether an update of a MacNode changes anything the solver looks
// at (agents update the status often, mostly the used memory). The agent's own memory
// drifts with every measurement, so a change of it alone does not count: each solve
// reads the latest figure.
func nodeChanged(old, cur *v1alpha1.MacNode) bool {
	a, b := solverNode(old), solverNode(cur)
	return a.Ready != b.Ready || a.Unschedulable != b.Unschedulable || a.Ceiling != b.Ceiling ||
		a.LinkBandwidth != b.LinkBandwidth || !maps.Equal(a.Labels, b.Labels)
}

// deploymentKey is the namespace/name of the replica's deployment: its
// macfleet.dev/deployment label, else its controller owner if that is a
// ModelDeployment; "" when neither names one.
func deploymentKey(r *v1alpha1.ModelReplica) string {
	name := r.Labels[v1alpha1.LabelDeployment]
	if name == "" {
		if ref := metav1.GetControllerOf(r); ref != nil && ref.Kind == "ModelDeployment" &&
			ref.APIVersion == v1alpha1.GroupVersion.String() {
			name = ref.Name
		}
	}
	if name == "" {
		return ""
	}
	return r.Namespace + "/" + name
}

// reserves reports whether the replica reserves its memory on its node: Resident
// (the default) and Pinned do, OnDemand does not.
func reserves(r *v1alpha1.ModelReplica) bool {
	return r.Spec.Template.Residency != v1alpha1.ResidencyOnDemand
}

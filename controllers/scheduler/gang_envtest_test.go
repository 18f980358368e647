package scheduler

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// createGangReplica creates a replica of deployment dep that may be split: layers
// blocks of perLayer GiB, a head of head GiB, workers of worker GiB; it reserves
// head + layers × perLayer on one Mac.
func (f *fixture) createGangReplica(name, dep string, layers int32, perLayer, head, worker float64) *v1alpha1.ModelReplica {
	f.t.Helper()
	mem := head + float64(layers)*perLayer
	r := newReplica(f.ns, replicaSpec{name: name, deployment: dep, memory: mem})
	r.Spec.LayerMemory = &v1alpha1.LayerMemory{Layers: layers, PerLayer: *qty(perLayer), Head: *qty(head), Worker: *qty(worker)}
	if err := f.c.Create(f.t.Context(), r); err != nil {
		f.t.Fatalf("creating ModelReplica %s: %v", name, err)
	}
	return r
}

// committed is each test node's committed memory as the scheduler accounts it, from
// the API server's MacNodes and replicas.
func (f *fixture) committed() map[string]int64 {
	f.t.Helper()
	var nodes v1alpha1.MacNodeList
	var replicas v1alpha1.ModelReplicaList
	if err := f.c.List(f.t.Context(), &nodes, client.MatchingLabels{runLabel: f.ns}); err != nil {
		f.t.Fatal(err)
	}
	if err := f.c.List(f.t.Context(), &replicas, client.InNamespace(f.ns)); err != nil {
		f.t.Fatal(err)
	}
	v := buildView(nodes.Items, replicas.Items, nil, nil)
	out := map[string]int64{}
	for _, n := range v.snap.Nodes {
		out[f.short(n.Name)] = n.Committed
	}
	return out
}

// checkCovers fails unless the split's shards are on distinct Macs, head first at
// nodeName, with contiguous inclusive ranges covering layers 0..layers-1 once.
func checkCovers(t *testing.T, r *v1alpha1.ModelReplica, layers int32) {
	t.Helper()
	s := r.Spec.Split
	if s == nil || len(s.Shards) < 2 || s.Shards[0].Node != r.Spec.NodeName {
		t.Fatalf("replica %s: nodeName %s, split %+v; want a gang headed by nodeName", r.Name, r.Spec.NodeName, s)
	}
	next, seen := int32(0), map[string]bool{}
	for _, sh := range s.Shards {
		if seen[sh.Node] || sh.FirstLayer != next || sh.LastLayer < sh.FirstLayer {
			t.Fatalf("replica %s: shard %+v after layer %d (Macs so far %v)", r.Name, sh, next-1, seen)
		}
		seen[sh.Node], next = true, sh.LastLayer+1
	}
	if next != layers {
		t.Fatalf("replica %s: shards cover layers 0..%d, want 0..%d", r.Name, next-1, layers-1)
	}
}

// TestGangPlacement runs the scheduler against the API server: a replica no Mac holds
// alone is bound to two Macs whose layer ranges cover every layer once, in one write;
// each Mac's committed memory carries its shard; a replica for which no gang fits is
// Unschedulable with the reason and reserves nothing; and a gang replaced after one of
// its Macs went down is placed whole on the Macs left.
func TestGangPlacement(t *testing.T) {
	f := newFixture(t)
	r := f.startScheduler()
	f.createNode(nodeSpec{name: "a", ceiling: 40})
	f.createNode(nodeSpec{name: "b", ceiling: 32})
	f.createNode(nodeSpec{name: "c", ceiling: 20})
	f.createDeployment("big", v1alpha1.Placement{MaxMacsPerReplica: 4})
	f.createDeployment("huge", v1alpha1.Placement{MaxMacsPerReplica: 4})
	f.createDeployment("other", v1alpha1.Placement{})
	f.waitCached(r, []string{"a", "b", "c"}, []string{"big", "huge", "other"})

	// 60 layers of 1 GiB, a 4 GiB head: 64 GiB, more than any Mac.
	f.createGangReplica("big-0", "big", 60, 1, 4, 0.5)
	got := f.waitScheduled("big-0", metav1.ConditionTrue, v1alpha1.ReasonBound)
	f.checkPair(got, "a", "b", 32, 60, 4+32, 0.5+28)
	// The worker shard's Mac finds the replica by its label; the head's by nodeName.
	if v := got.Labels[v1alpha1.ShardLabel(f.node("b"))]; v != v1alpha1.ShardLabelWorker {
		t.Errorf("label %s = %q, want %q (b holds a worker shard); labels %v", v1alpha1.ShardLabel(f.node("b")), v, v1alpha1.ShardLabelWorker, got.Labels)
	}
	for _, n := range []string{"a", "c"} {
		if _, ok := got.Labels[v1alpha1.ShardLabel(f.node(n))]; ok {
			t.Errorf("big-0 carries the worker label of %s, which holds no worker shard: %v", n, got.Labels)
		}
	}
	note := fmt.Sprintf("Bound to 2 Macs: %s (head, layers 0-31), %s (layers 32-59)", f.node("a"), f.node("b"))
	if c := findScheduled(got); c.Message != note {
		t.Errorf("Scheduled message %q, want %q", c.Message, note)
	}
	f.waitEvent("big-0", EventScheduled, note)

	// Per-Mac accounting: each Mac carries its own shard, c nothing.
	wantCommitted := map[string]int64{"a": qty(36).Value(), "b": qty(28.5).Value(), "c": 0}
	if got := f.committed(); fmt.Sprint(got) != fmt.Sprint(wantCommitted) {
		t.Errorf("committed by Mac %v, want %v", got, wantCommitted)
	}
	// The scheduler holds to it: 25 GiB fitted a or b before the gang, no Mac now.
	f.createReplica(replicaSpec{name: "other-0", deployment: "other", memory: 25})
	held := f.waitScheduled("other-0", metav1.ConditionFalse, string(ReasonInsufficientMemory))
	if c, w := findScheduled(held).Message, "0/3 Macs fit: 3 insufficient memory (need 25.0GiB, largest free 20.0GiB)"; c != w {
		t.Errorf("other-0: %q, want %q", c, w)
	}

	// No gang fits: Unschedulable with why, nothing reserved.
	f.createGangReplica("huge-0", "huge", 400, 1.25, 20, 1)
	f.waitHeld("huge-0", "0/3 Macs fit: 3 insufficient memory (need 520.0GiB, largest free 20.0GiB); "+
		"no gang of up to 4 Macs: the 3 eligible Macs have 27.5GiB free together, a gang of 3 needs 522.0GiB")
	if got := f.committed(); fmt.Sprint(got) != fmt.Sprint(wantCommitted) {
		t.Errorf("committed by Mac after the failed gang %v, want %v", got, wantCommitted)
	}

	// b goes down; the deployment controller replaces the broken gang (deleted here,
	// a new replica created); the new one is placed whole on the Macs left.
	for _, name := range []string{"huge-0", "other-0"} {
		if err := f.c.Delete(t.Context(), &v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	f.patchNode("b", true, func(n *v1alpha1.MacNode) {
		n.Status.Conditions[0].Status = metav1.ConditionFalse
	})
	if err := f.c.Delete(t.Context(), &v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "big-0"}}); err != nil {
		t.Fatal(err)
	}
	f.createNode(nodeSpec{name: "d", ceiling: 30})
	f.createGangReplica("big-1", "big", 60, 1, 4, 0.5)
	again := f.waitScheduled("big-1", metav1.ConditionTrue, v1alpha1.ReasonBound)
	checkCovers(t, again, 60)
	for _, sh := range again.Spec.Split.Shards {
		if sh.Node == f.node("b") {
			t.Errorf("big-1 has a shard on the NotReady Mac b: %+v", again.Spec.Split)
		}
	}
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		c := f.committed()
		return c["b"] == 0 && c["a"] > 0 && c["d"] > 0, fmt.Sprintf("committed by Mac %v, want a and d, not b", c)
	})
}

// TestGangCountsTheAgentsMemory runs the scheduler against the API server with Macs
// whose agents report their own memory (status.memory.agent): a gang that would fill
// two Macs exactly but for their agents' share is Unschedulable, with a message that
// names the agents' memory, and is placed once a Mac that holds its share with its
// agent's arrives, with room for the agent on every Mac it uses.
func TestGangCountsTheAgentsMemory(t *testing.T) {
	f := newFixture(t)
	r := f.startScheduler()
	// 60 layers of 1 GiB, a 4 GiB head, 0.5 GiB workers: a (34) heads 30 layers
	// and b (30.5) works 30, exactly, leaving nothing for their agents' 64 MiB.
	f.createNode(nodeSpec{name: "a", ceiling: 34, agentMiB: 64})
	f.createNode(nodeSpec{name: "b", ceiling: 30.5, agentMiB: 64})
	f.createDeployment("big", v1alpha1.Placement{MaxMacsPerReplica: 2})
	f.waitCached(r, []string{"a", "b"}, []string{"big"})

	f.createGangReplica("big-0", "big", 60, 1, 4, 0.5)
	f.waitHeld("big-0", "0/2 Macs fit: 2 insufficient memory (need 64.0GiB, largest free 33.9GiB after its agent's own 64MiB); "+
		"no gang of up to 2 Macs: the 2 eligible Macs have 64.3GiB free together after their agents' own 128MiB, a gang of 2 needs 64.5GiB")

	// c (36) heads 31 layers with room for its agent; b then works 29 with room for its own.
	f.createNode(nodeSpec{name: "c", ceiling: 36, agentMiB: 64})
	got := f.waitScheduled("big-0", metav1.ConditionTrue, v1alpha1.ReasonBound)
	f.checkPair(got, "c", "b", 31, 60, 4+31, 0.5+29)
	ceilings := map[string]float64{"a": 34, "b": 30.5, "c": 36}
	for name, c := range f.committed() {
		if room := qty(ceilings[name]).Value() - c; room < 64<<20 {
			t.Errorf("Mac %s: %d bytes left beyond its shards, less than its agent's 64 MiB", name, room)
		}
	}
}

// waitHeld waits for replica name to be Unschedulable for insufficient memory and
// fails unless its message is msg and it is bound to nothing.
func (f *fixture) waitHeld(name, msg string) {
	f.t.Helper()
	held := f.waitScheduled(name, metav1.ConditionFalse, string(ReasonInsufficientMemory))
	if c := findScheduled(held); c.Message != msg {
		f.t.Errorf("%s:\n  %s\nwant\n  %s", name, c.Message, msg)
	}
	if held.Spec.NodeName != "" || held.Spec.Split != nil {
		f.t.Errorf("%s bound to %q with split %+v, want nothing", name, held.Spec.NodeName, held.Spec.Split)
	}
}

// checkPair fails unless r is a gang of layers layers on two Macs: head (layers
// 0..split-1, headGiB reserved) and worker (the rest, workerGiB).
func (f *fixture) checkPair(r *v1alpha1.ModelReplica, head, worker string, split, layers int32, headGiB, workerGiB float64) {
	f.t.Helper()
	checkCovers(f.t, r, layers)
	want := &v1alpha1.ReplicaSplit{Shards: []v1alpha1.ReplicaShard{
		{Node: f.node(head), FirstLayer: 0, LastLayer: split - 1, Memory: *qty(headGiB)},
		{Node: f.node(worker), FirstLayer: split, LastLayer: layers - 1, Memory: *qty(workerGiB)},
	}, Macs: f.node(head) + "," + f.node(worker), Layers: fmt.Sprintf("0-%d,%d-%d", split-1, split, layers-1)}
	if !equalSplit(r.Spec.Split, want) {
		f.t.Errorf("split:\n  %+v\nwant\n  %+v", r.Spec.Split, want)
	}
}

// equalSplit compares splits, quantities by value.
func equalSplit(a, b *v1alpha1.ReplicaSplit) bool {
	if a == nil || b == nil || len(a.Shards) != len(b.Shards) || a.Macs != b.Macs || a.Layers != b.Layers {
		return a == b
	}
	for i := range a.Shards {
		x, y := a.Shards[i], b.Shards[i]
		if x.Node != y.Node || x.FirstLayer != y.FirstLayer || x.LastLayer != y.LastLayer || x.Memory.Cmp(y.Memory) != 0 {
			return false
		}
	}
	return true
}

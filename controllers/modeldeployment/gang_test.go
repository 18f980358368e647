package modeldeployment

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
)

// broken marks r as a gang that lost a Mac.
func broken(r replicaInfo) replicaInfo { r.BrokenGang = true; return r }

func TestPlanReplacesBrokenGangs(t *testing.T) {
	tests := []struct {
		name     string
		desired  int
		replicas []replicaInfo
		want     actions
	}{
		{"a broken gang is deleted and replaced", 2,
			[]replicaInfo{rep("a", "crb", 1), broken(rep("g", "crb", 2))},
			actions{Create: 1, Delete: []string{"g"}}},
		{"even while not ready yet", 1,
			[]replicaInfo{broken(rep("g", "cb", 2))},
			actions{Create: 1, Delete: []string{"g"}}},
		{"an old broken gang mid-rollout is deleted, not counted as serving", 1,
			[]replicaInfo{broken(rep("old", "rb", 1)), rep("new", "cb", 2)},
			actions{Delete: []string{"old"}}},
		{"a healthy gang stays", 1,
			[]replicaInfo{rep("g", "crb", 2)},
			actions{}},
		{"scaled to zero: deleted once", 0,
			[]replicaInfo{broken(rep("g", "crb", 2))},
			actions{Delete: []string{"g"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, plan(tt.desired, tt.replicas), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// withShards sets mr's status.shards from node, phase pairs.
func withShards(mr *v1alpha1.ModelReplica, pairs ...any) *v1alpha1.ModelReplica {
	for i := 0; i+1 < len(pairs); i += 2 {
		mr.Status.Shards = append(mr.Status.Shards, v1alpha1.ShardStatus{Node: pairs[i].(string), Phase: pairs[i+1].(v1alpha1.ReplicaPhase)})
	}
	return mr
}

func splitReplica(nodes ...string) *v1alpha1.ModelReplica {
	mr := &v1alpha1.ModelReplica{}
	mr.Spec.NodeName = nodes[0]
	if len(nodes) > 1 {
		mr.Spec.Split = &v1alpha1.ReplicaSplit{}
		for _, n := range nodes {
			mr.Spec.Split.Shards = append(mr.Spec.Split.Shards, v1alpha1.ReplicaShard{Node: n})
		}
	}
	return mr
}

func TestGangBroken(t *testing.T) {
	ready := func(nodes ...string) func(string) bool {
		return func(n string) bool {
			for _, r := range nodes {
				if r == n {
					return true
				}
			}
			return false
		}
	}
	tests := []struct {
		name string
		mr   *v1alpha1.ModelReplica
		up   func(string) bool
		want bool
	}{
		{"one Mac, down: not a gang (the replica waits for its Mac)", splitReplica("a"), ready(), false},
		{"every shard's Mac ready", splitReplica("a", "b", "c"), ready("a", "b", "c"), false},
		{"a worker's Mac lost", splitReplica("a", "b", "c"), ready("a", "c"), true},
		{"the head's Mac lost", splitReplica("a", "b"), ready("b"), true},
		{"a worker shard failed", withShards(splitReplica("a", "b", "c"), "a", v1alpha1.ReplicaRunning, "b", v1alpha1.ReplicaFailed, "c", v1alpha1.ReplicaRunning), ready("a", "b", "c"), true},
		{"the head's shard failed", withShards(splitReplica("a", "b"), "a", v1alpha1.ReplicaFailed), ready("a", "b"), true},
		{"shards loading and ready", withShards(splitReplica("a", "b", "c"), "a", v1alpha1.ReplicaLoading, "b", v1alpha1.ReplicaRunning), ready("a", "b", "c"), false},
		{"a Failed entry of a Mac not in the split", withShards(splitReplica("a", "b"), "z", v1alpha1.ReplicaFailed), ready("a", "b"), false},
		{"not split: its Failed phase is not a broken gang", withShards(splitReplica("a"), "a", v1alpha1.ReplicaFailed), ready("a"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := gangBroken(tt.mr, tt.up); got != tt.want {
				t.Errorf("gangBroken = %v, want %v", got, tt.want)
			}
		})
	}
	if got, want := replicaNodes(splitReplica("a", "b")), []string{"a", "b"}; !cmp.Equal(got, want) {
		t.Errorf("replicaNodes = %v, want %v", got, want)
	}
	if !onNode(splitReplica("a", "b"), "b") || onNode(splitReplica("a"), "b") {
		t.Error("onNode does not see shards")
	}
}

func TestLayerMemoryFor(t *testing.T) {
	const gib = int64(1) << 30
	l := estimate.Layered{Layers: 80, PerLayer: gib / 2, Head: 4 * gib, Worker: gib}
	whole := l.Head + l.Layers*l.PerLayer // 44 GiB
	tests := []struct {
		name        string
		reservation int64
		wantHead    int64
	}{
		{"the estimate itself", whole, 4 * gib},
		{"an override twice as large scales head and layers", 2 * whole, 8 * gib},
		{"a measured footprint a bit smaller", whole - gib, 4*gib - gib/11},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lm := layerMemoryFor(l, tt.reservation, 1)
			if lm == nil {
				t.Fatal("nil layer memory")
			}
			total := lm.Head.Value() + int64(lm.Layers)*lm.PerLayer.Value()
			if total < tt.reservation || total >= tt.reservation+int64(lm.Layers) {
				t.Errorf("head + layers × perLayer = %d, want within [%d, %d)", total, tt.reservation, tt.reservation+int64(lm.Layers))
			}
			if d := lm.Head.Value() - tt.wantHead; d < -1 || d > 1 {
				t.Errorf("head = %d, want %d", lm.Head.Value(), tt.wantHead)
			}
			if lm.Layers != 80 || !lm.Worker.Equal(*resource.NewQuantity(gib, resource.BinarySI)) {
				t.Errorf("layers %d, worker %s; want 80 and 1Gi unscaled", lm.Layers, lm.Worker.String())
			}
		})
	}
	if lm := layerMemoryFor(estimate.Layered{}, whole, 1); lm != nil {
		t.Errorf("no layers: %+v, want nil", lm)
	}
}

// TestLayerMemoryForPipeline: a head of N llama contexts (engine splitPipeline)
// reserves N-1 more compute buffers, and so does every worker; the layers and the
// scaling to the reservation are those of one context.
func TestLayerMemoryForPipeline(t *testing.T) {
	const gib = int64(1) << 30
	l := estimate.Layered{Layers: 80, PerLayer: gib / 2, Head: 4 * gib, Worker: gib, Compute: gib / 4}
	whole := l.Head + l.Layers*l.PerLayer
	one := layerMemoryFor(l, whole, 1)
	for _, tt := range []struct {
		pipeline int
		extra    int64
	}{{0, 0}, {1, 0}, {2, gib / 4}, {4, 3 * gib / 4}} {
		lm := layerMemoryFor(l, whole, tt.pipeline)
		if got, want := lm.Head.Value(), one.Head.Value()+tt.extra; got != want {
			t.Errorf("pipeline %d: head %d, want %d", tt.pipeline, got, want)
		}
		if got, want := lm.Worker.Value(), one.Worker.Value()+tt.extra; got != want {
			t.Errorf("pipeline %d: worker %d, want %d", tt.pipeline, got, want)
		}
		if !lm.PerLayer.Equal(one.PerLayer) || lm.Layers != one.Layers {
			t.Errorf("pipeline %d: layers %d of %s, want %d of %s", tt.pipeline, lm.Layers, lm.PerLayer.String(), one.Layers, one.PerLayer.String())
		}
	}
}

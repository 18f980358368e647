package modeldeployment

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
)

// TestBrokenGangIsReplacedWhole runs the controller against the API server: the
// replicas of a deployment that may span 3 Macs carry the estimate's layer memory;
// bound as a gang (the test plays the scheduler) and serving, the replica is deleted
// at once, without a drain, when the Mac of one of its workers stops being Ready, and
// a new unbound replica takes its place for the scheduler to place whole; so is one
// whose worker shard its Mac's agent reports Failed.
func TestBrokenGangIsReplacedWhole(t *testing.T) {
	f, macs, mr := newGangFixture(t, &Reconciler{})
	est := gangEstimate()
	l, _ := est.ByLayer()
	want := layerMemoryFor(l, roundUpMiB(est.Total).Value(), 1)
	if mr.Spec.LayerMemory == nil || mr.Spec.LayerMemory.Layers != 48 || !mr.Spec.LayerMemory.PerLayer.Equal(want.PerLayer) ||
		!mr.Spec.LayerMemory.Head.Equal(want.Head) || !mr.Spec.LayerMemory.Worker.Equal(want.Worker) {
		t.Fatalf("layerMemory %+v, want %+v", mr.Spec.LayerMemory, want)
	}

	f.bindGang(&mr, macs)
	f.markLoaded(&mr)
	f.waitStatus("big", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == 1 && len(md.Status.Nodes) == 2, md.Status.Ready + " on " + condition(md, v1alpha1.DeploymentAvailable)
	})
	if got := f.deployment("big").Status.Nodes; got[0] != macs[0] || got[1] != macs[1] {
		t.Errorf("status.nodes %v, want both Macs of the gang %v", got, macs)
	}
	gone := f.watchDeletions()

	f.setMacReady(macs[1], metav1.ConditionFalse)
	if last := gone(mr.Name); last.Spec.Drain != nil {
		t.Errorf("the broken gang was drained (from %s), want deleted at once", last.Spec.Drain)
	}
	next := f.waitReplicas(1)[0]
	if next.Name == mr.Name || next.Spec.NodeName != "" || next.Spec.Split != nil ||
		next.Spec.LayerMemory == nil || next.Spec.LayerMemory.Layers != 48 {
		t.Errorf("replacement %s: nodeName %q, split %+v, layerMemory %+v; want a new unbound replica with the layers",
			next.Name, next.Spec.NodeName, next.Spec.Split, next.Spec.LayerMemory)
	}

	// Both Macs Ready, the replacement bound and serving; then the agent of its worker
	// shard's Mac reports the shard Failed (its worker process died): deleted at once
	// too, and replaced.
	f.setMacReady(macs[1], metav1.ConditionTrue)
	before := next.DeepCopy()
	next.Spec.NodeName, next.Spec.Split = macs[0], mr.Spec.Split
	if err := f.c.Patch(t.Context(), &next, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		t.Fatalf("binding the replacement as a gang: %v", err)
	}
	f.markLoaded(&next)
	f.waitStatus("big", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == 1, md.Status.Ready
	})
	before = next.DeepCopy()
	next.Status.Shards = []v1alpha1.ShardStatus{{Node: macs[0], Phase: v1alpha1.ReplicaRunning}, {Node: macs[1], Phase: v1alpha1.ReplicaFailed}}
	if err := f.c.Status().Patch(t.Context(), &next, client.MergeFrom(before)); err != nil {
		t.Fatalf("reporting the worker shard failed: %v", err)
	}
	if last := gone(next.Name); last.Spec.Drain != nil {
		t.Errorf("the gang with a failed shard was drained (from %s), want deleted at once", last.Spec.Drain)
	}
	third := f.waitReplicas(1)[0]
	if third.Name == next.Name || third.Spec.NodeName != "" || third.Spec.Split != nil {
		t.Errorf("replacement %s: nodeName %q, split %+v; want a new unbound replica", third.Name, third.Spec.NodeName, third.Spec.Split)
	}
}

// gangEstimate is the estimate of a 48-layer model of about 49 GiB.
func gangEstimate() estimate.Result {
	const gib = int64(1) << 30
	est := estimate.Result{Weights: 40 * gib, KVCache: 8 * gib, Compute: gib, Overhead: 256 << 20,
		Dims: estimate.Dims{Layers: 48, Vocab: 32000, Embd: 4096, Params: 70_000_000_000}}
	est.Total = est.Weights + est.KVCache + est.Compute + est.Overhead
	return est
}

// newGangFixture starts r with gangEstimate against the API server, two Ready Macs,
// and deployment "big" of one replica that may span 3 Macs; it returns the replica.
func newGangFixture(t *testing.T, r *Reconciler) (*fixture, []string, v1alpha1.ModelReplica) {
	t.Helper()
	est := gangEstimate()
	r.Estimate = func(context.Context, estimate.Params) (estimate.Result, error) { return est, nil }
	f := newFixture(t)
	f.start(r)
	macs := []string{f.readyMacNode("a"), f.readyMacNode("b")}
	md := newDeployment("big", "https://models.example/big.gguf", 1, "")
	md.Spec.Placement.MaxMacsPerReplica = 3
	f.create(md)
	return f, macs, f.waitReplicas(1)[0]
}

// TestPipelinedGangReservesComputeBuffers runs the controller against the API server: a
// deployment whose split head decodes in two llama contexts (engine.splitPipeline 2)
// gives its replicas that setting in their template and a layerMemory whose head and
// worker each hold one more compute buffer than one context's, and whose head holds the
// second context's output buffer, the layers unchanged.
func TestPipelinedGangReservesComputeBuffers(t *testing.T) {
	r := &Reconciler{}
	est := gangEstimate()
	// 16 sequences: one context's output buffer is bounded by n_batch, two contexts
	// of 8 hold one each.
	est.Parallel, est.Batch = 16, 512
	r.Estimate = func(context.Context, estimate.Params) (estimate.Result, error) { return est, nil }
	f := newFixture(t)
	f.start(r)
	md := newDeployment("big", "https://models.example/big.gguf", 1, "")
	md.Spec.Placement.MaxMacsPerReplica = 2
	md.Spec.Engine.Parallel = 16
	md.Spec.Engine.SplitPipeline = 2
	f.create(md)
	mr := f.waitReplicas(1)[0]

	if got := mr.Spec.Template.Engine.SplitPipeline; got != 2 {
		t.Errorf("the replica's template has splitPipeline %d, want 2", got)
	}
	l, _ := est.ByLayer()
	one := layerMemoryFor(l, roundUpMiB(est.Total).Value(), 1)
	lm := mr.Spec.LayerMemory
	if lm == nil {
		t.Fatal("the replica has no layerMemory")
	}
	// A second compute buffer, and 512 more output rows of (vocab + embd) floats.
	output := int64(512 * (32000 + 4096) * 4)
	if got, want := lm.Head.Value(), one.Head.Value()+est.Compute+output; got != want {
		t.Errorf("layerMemory.head %d, want one context's %d, a compute buffer %d and an output buffer %d", got, one.Head.Value(), est.Compute, output)
	}
	if got, want := lm.Worker.Value(), one.Worker.Value()+est.Compute; got != want {
		t.Errorf("layerMemory.worker %d, want one context's %d and a compute buffer %d", got, one.Worker.Value(), est.Compute)
	}
	if lm.Layers != one.Layers || !lm.PerLayer.Equal(one.PerLayer) {
		t.Errorf("layerMemory layers %d of %s, want %d of %s", lm.Layers, lm.PerLayer.String(), one.Layers, one.PerLayer.String())
	}
}

// bindGang plays the scheduler: it binds mr as a gang of macs[0] (the head, layers
// 0-23) and macs[1] (layers 24-47) in one write.
func (f *fixture) bindGang(mr *v1alpha1.ModelReplica, macs []string) {
	f.t.Helper()
	before := mr.DeepCopy()
	mr.Spec.NodeName = macs[0]
	mr.Spec.Split = &v1alpha1.ReplicaSplit{Shards: []v1alpha1.ReplicaShard{
		{Node: macs[0], FirstLayer: 0, LastLayer: 23, Memory: resource.MustParse("26Gi")},
		{Node: macs[1], FirstLayer: 24, LastLayer: 47, Memory: resource.MustParse("25Gi")},
	}}
	if err := f.c.Patch(f.t.Context(), mr, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		f.t.Fatalf("binding as a gang: %v", err)
	}
}

// TestSplitOverrideWaitsForTheHeader runs the controller against the API server: a
// deployment that may span Macs and sets resources.memory still needs the model's
// header to divide it over its layers. While reading the header fails, no replica is
// created (one without layerMemory could never be placed as a gang, and the field is
// immutable) and the conditions say why; once the header is read, the replica comes
// with the override as its reservation and the layers.
func TestSplitOverrideWaitsForTheHeader(t *testing.T) {
	est := gangEstimate()
	var failing atomic.Bool
	failing.Store(true)
	r := &Reconciler{EstimateRetryInitial: 200 * time.Millisecond, EstimateRetryMax: 200 * time.Millisecond}
	r.Estimate = func(context.Context, estimate.Params) (estimate.Result, error) {
		if failing.Load() {
			return estimate.Result{}, errors.New("the model server answered 503")
		}
		return est, nil
	}
	f := newFixture(t)
	f.start(r)
	md := newDeployment("big", "https://models.example/big.gguf", 1, "60Gi")
	md.Spec.Placement.MaxMacsPerReplica = 2
	f.create(md)

	const why = "dividing the model over Macs (placement.maxMacsPerReplica 2) needs its header: estimating the memory of https://models.example/big.gguf: the model server answered 503"
	f.waitStatus("big", func(md *v1alpha1.ModelDeployment) (bool, string) {
		got := condition(md, v1alpha1.DeploymentScheduled)
		return got == "False/"+v1alpha1.ReasonEstimateFailed+": "+why, got
	})
	if reps := f.replicas(); len(reps) != 0 {
		t.Fatalf("replicas %v created while the header could not be read, want none", names(reps))
	}

	failing.Store(false)
	mr := f.waitReplicas(1)[0]
	if got := mr.Spec.MemoryReservation.String(); got != "60Gi" {
		t.Errorf("reservation %s, want the override 60Gi", got)
	}
	l, _ := est.ByLayer()
	want := layerMemoryFor(l, mr.Spec.MemoryReservation.Value(), 1)
	if lm := mr.Spec.LayerMemory; lm == nil || lm.Layers != want.Layers || !lm.Head.Equal(want.Head) || !lm.PerLayer.Equal(want.PerLayer) {
		t.Errorf("layerMemory %+v, want %+v (the header's layers scaled to the override)", lm, want)
	}
	f.waitStatus("big", func(md *v1alpha1.ModelDeployment) (bool, string) {
		got := condition(md, v1alpha1.DeploymentScheduled)
		return !strings.Contains(got, v1alpha1.ReasonEstimateFailed), got
	})
}

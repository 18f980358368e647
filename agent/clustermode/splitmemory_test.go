package clustermode_test

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestSplitReplicaShardsReportTheirMemory: two cluster agents against a real API
// server run a split replica (the head on one Mac, a worker shard on the other). Each
// Mac's agent reports its own shard's measured resident and peak in status.shards.
// Drained as the deployment controller drains a replica it removes, the head's agent
// unloads its runner and reports Drained; the worker's Mac then unloads its shard
// through its own pool's settle barrier and reports that unload in its entry — the
// very report its pool kept — so that, when the replica is deleted, its last status
// lists every shard's freed bytes, each measured by its own Mac.
func TestSplitReplicaShardsReportTheirMemory(t *testing.T) {
	head, worker, ns := startSplit(t)
	measured := func(s *v1alpha1.ShardStatus) bool {
		return s != nil && s.Phase == v1alpha1.ReplicaRunning && s.Resident != nil && s.Resident.Value() > 0 &&
			s.Peak != nil && s.Peak.Cmp(*s.Resident) >= 0
	}
	waitReplica(t, 2*time.Minute, ns, "big-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return meta.IsStatusConditionTrue(mr.Status.Conditions, v1alpha1.ReplicaReady) &&
			measured(mr.ShardEntry(head.node)) && measured(mr.ShardEntry(worker.node)), statusJSON(mr)
	})

	// Drain it, as the deployment controller does before deleting a replica.
	var mr v1alpha1.ModelReplica
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "big-0"}, &mr); err != nil {
		t.Fatal(err)
	}
	// A merge patch, not an update: the agents write the replica's status meanwhile,
	// which an update of the object read before would conflict with.
	drainAt := metav1.Now()
	before := mr.DeepCopy()
	mr.Spec.Drain = &drainAt
	if err := env.Client.Patch(t.Context(), &mr, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	unloaded := func(s *v1alpha1.ShardStatus) bool {
		return s != nil && s.Phase == v1alpha1.ReplicaDraining && s.LastUnload.UnloadedSince(&drainAt) &&
			s.LastUnload.Reason == "Drained" && s.LastUnload.ResidentBytes > 0 && s.Resident == nil
	}
	last := waitReplica(t, 2*time.Minute, ns, "big-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return mr.DrainReported() && unloaded(mr.ShardEntry(head.node)) && unloaded(mr.ShardEntry(worker.node)), statusJSON(mr)
	})
	for _, tc := range []struct {
		a    *testAgent
		pool string
	}{{head, ns + "/big-0"}, {worker, "split-worker:" + ns + "/big-0"}} {
		m, ok := tc.a.model(tc.pool)
		got := last.ShardEntry(tc.a.node).LastUnload
		if !ok || m.LastUnload == nil || m.LastUnload.FreedBytes != got.FreedBytes || m.LastUnload.ResidentBytes != got.ResidentBytes ||
			string(m.LastUnload.Outcome) != string(got.Outcome) {
			t.Errorf("%s's entry reports the unload %+v; its own pool's entry %s: %+v", tc.a.node, got, tc.pool, m.LastUnload)
		}
	}
	for _, s := range last.Status.Shards {
		t.Logf("%s: freed %d bytes (%s), %d resident before the stop", s.Node, s.LastUnload.FreedBytes, s.LastUnload.Outcome,
			s.LastUnload.ResidentBytes)
	}
	if h := last.ShardEntry(head.node).LastUnload; !equality.Semantic.DeepEqual(last.Status.LastUnload, h) {
		t.Errorf("status.lastUnload %+v, want the head's entry's %+v", last.Status.LastUnload, h)
	}

	if err := env.Client.Delete(t.Context(), &mr); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		_, found := worker.model("split-worker:" + ns + "/big-0")
		return !found, "the deleted replica's retired worker is still in the worker Mac's pool"
	})
}

package modeldeployment

import (
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestSplitDrainWaitsForEveryShard runs the controller against the API server: a
// split replica scaled away is drained, and after its head's agent reports the head's
// runner unloaded the replica stays until the worker shard's Mac has reported its own
// unload in its status.shards entry; its last state lists every shard's freed bytes
// and the Event names the worker's.
func TestSplitDrainWaitsForEveryShard(t *testing.T) {
	f, macs, mr := newGangFixture(t, &Reconciler{DrainTimeout: 10 * time.Minute})
	f.bindGang(&mr, macs)
	f.markLoaded(&mr)
	f.waitStatus("big", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == 1, md.Status.Ready
	})
	gone := f.watchDeletions()

	f.update("big", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](0) })
	mr = f.waitDraining()
	unload := func(freed int64) *v1alpha1.UnloadReport {
		return &v1alpha1.UnloadReport{Reason: "Drained", FreedBytes: freed, ResidentBytes: freed + 1<<20,
			Outcome: v1alpha1.UnloadSettled, Duration: metav1.Duration{Duration: time.Second}, Time: metav1.Now()}
	}
	f.reportLoaded(&mr, metav1.ConditionFalse, v1alpha1.ReasonDrained, unload(26<<30))
	// The worker shard's Mac unloads its shard only now: the replica must still be
	// there for it to report.
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		err := f.c.Get(t.Context(), client.ObjectKeyFromObject(&mr), &mr)
		if err == nil {
			mr.Status.Shards = append(mr.Status.Shards, v1alpha1.ShardStatus{Node: macs[1], Phase: v1alpha1.ReplicaDraining,
				LastUnload: unload(25 << 30)})
			err = f.c.Status().Update(t.Context(), &mr)
		}
		if apierrors.IsNotFound(err) {
			t.Fatalf("the replica was deleted before its worker shard's Mac reported its unload: %v", err)
		}
		return err == nil, fmt.Sprint(err)
	})

	last := gone(mr.Name)
	if e := last.ShardEntry(macs[1]); e == nil || e.LastUnload == nil || e.LastUnload.FreedBytes != 25<<30 ||
		last.Status.LastUnload == nil || last.Status.LastUnload.FreedBytes != 26<<30 {
		t.Fatalf("the replica's last state: lastUnload %+v, shards %+v; want the head's 26 GiB and the worker's 25 GiB",
			last.Status.LastUnload, last.Status.Shards)
	}
	f.waitEvent(ReasonReplicaDrained, fmt.Sprintf("Replica %s drained and unloaded on %s, freed 26624.0 MiB; its worker shards: %s freed 25600.0 MiB",
		mr.Name, macs[0], macs[1]))
}

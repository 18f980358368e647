package modeldeployment

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestScaleDownDrainsBeforeDeleting: scaling 2→1 sets spec.drain on one replica
// instead of deleting it; the replica stays while its agent drains, and is deleted
// only once the agent reports the model unloaded, with the unload recorded in the
// replica's last state and in an Event on the deployment.
func TestScaleDownDrainsBeforeDeleting(t *testing.T) {
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t), DrainTimeout: 10 * time.Minute})
	macs := []string{f.readyMacNode("a"), f.readyMacNode("b")}
	f.create(newDeployment("m", "http://models.example/m.gguf", 2, "1Gi"))
	for i, mr := range f.waitReplicas(2) {
		f.bind(&mr, macs[i])
		f.markLoaded(&mr)
	}
	f.waitStatus("m", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == 2, md.Status.Ready
	})
	gone := f.watchDeletions()

	f.update("m", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](1) })
	mr := f.waitDraining()
	if n := len(f.replicas()); n != 2 {
		t.Fatalf("%d replicas right after the drain began, want both (the draining one is not deleted yet)", n)
	}
	// The agent unloads: first the drain (the model is leaving memory), which must not
	// end the drain, then the report of the unload.
	f.reportLoaded(&mr, metav1.ConditionFalse, v1alpha1.ReasonDraining, nil)
	f.waitStatus("m", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.Replicas == 1 && md.Status.ReadyReplicas == 1,
			fmt.Sprintf("%d replicas, %d ready: the draining one must not count", md.Status.Replicas, md.Status.ReadyReplicas)
	})
	if got := f.replicas(); len(got) != 2 {
		t.Fatalf("the draining replica was deleted before its agent reported the unload: left %v", names(got))
	}
	unload := &v1alpha1.UnloadReport{Reason: "Drained", FreedBytes: 312 << 20, ResidentBytes: 320 << 20,
		Outcome: v1alpha1.UnloadSettled, Duration: metav1.Duration{Duration: time.Second}, Time: metav1.Now()}
	f.reportLoaded(&mr, metav1.ConditionFalse, v1alpha1.ReasonDrained, unload)

	last := gone(mr.Name)
	if last.Spec.Drain == nil || last.Status.LastUnload == nil || last.Status.LastUnload.FreedBytes != 312<<20 {
		t.Fatalf("the replica was deleted with drain %v and lastUnload %+v, want drained with 312 MiB freed recorded",
			last.Spec.Drain, last.Status.LastUnload)
	}
	f.waitEvent(ReasonReplicaDrained, fmt.Sprintf("Replica %s drained and unloaded on %s, freed 312.0 MiB", mr.Name, mr.Spec.NodeName))
	if left := f.waitReplicas(1); left[0].Spec.Drain != nil {
		t.Errorf("the replica kept, %s, is draining too", left[0].Name)
	}
}

// TestScaleDownOnNotReadyMacDeletesAtOnce: a loaded replica whose Mac is not Ready
// has no agent to drain it: it is deleted without a drain.
func TestScaleDownOnNotReadyMacDeletesAtOnce(t *testing.T) {
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t), DrainTimeout: 10 * time.Minute})
	lost := f.macNode("lost", v1alpha1.PressureOK) // no Ready condition
	f.create(newDeployment("m", "http://models.example/m.gguf", 1, "1Gi"))
	mr := f.waitReplicas(1)[0]
	f.bind(&mr, lost)
	f.markLoaded(&mr)
	f.waitStatus("m", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == 1, md.Status.Ready
	})
	gone := f.watchDeletions()

	f.update("m", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](0) })
	if last := gone(mr.Name); last.Spec.Drain != nil {
		t.Errorf("the replica on the NotReady Mac was drained (from %s) before its deletion, want deleted at once", last.Spec.Drain)
	}
}

// TestDrainEndsWhenTheMacGoesDownOrTimesOut: a draining replica whose agent never
// reports is deleted when its Mac stops being Ready, or else once the drain timeout
// has passed, not before.
func TestDrainEndsWhenTheMacGoesDownOrTimesOut(t *testing.T) {
	const timeout = 3 * time.Second
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t), DrainTimeout: timeout})
	macs := []string{f.readyMacNode("a"), f.readyMacNode("b")}
	f.create(newDeployment("m", "http://models.example/m.gguf", 2, "1Gi"))
	reps := f.waitReplicas(2)
	for i := range reps {
		f.bind(&reps[i], macs[i])
		f.markLoaded(&reps[i])
	}
	f.waitStatus("m", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == 2, md.Status.Ready
	})
	gone := f.watchDeletions()

	// The Mac goes down mid-drain: deleted then, long before the timeout would.
	f.update("m", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](1) })
	first := f.waitDraining()
	f.setMacReady(first.Spec.NodeName, metav1.ConditionFalse)
	if last := gone(first.Name); last.Status.LastUnload != nil {
		t.Errorf("deleted with a lastUnload %+v the test never reported", last.Status.LastUnload)
	}
	f.waitEvent(ReasonReplicaDrained, fmt.Sprintf("Replica %s deleted while draining: its Mac %s is not Ready", first.Name, first.Spec.NodeName))

	// No report at all: deleted at the timeout.
	f.update("m", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](0) })
	second := f.waitDraining()
	last := gone(second.Name)
	if at := time.Now(); at.Before(second.Spec.Drain.Add(timeout)) {
		t.Errorf("deleted at %s, before the drain that began at %s timed out (%s)", at.Format(time.RFC3339Nano),
			second.Spec.Drain.Format(time.RFC3339), timeout)
	}
	if last.Spec.Drain == nil {
		t.Errorf("the replica was deleted without a drain")
	}
	f.waitEvent(ReasonReplicaDrained, fmt.Sprintf("Replica %s deleted: its agent on %s did not report the model unloaded within %s",
		second.Name, second.Spec.NodeName, timeout))
}

// readyMacNode creates a MacNode (see macNode) whose Ready condition is True.
func (f *fixture) readyMacNode(suffix string) string {
	f.t.Helper()
	name := f.macNode(suffix, v1alpha1.PressureOK)
	f.setMacReady(name, metav1.ConditionTrue)
	return name
}

// setMacReady plays the macnode controller: it sets the MacNode's Ready condition.
func (f *fixture) setMacReady(name string, status metav1.ConditionStatus) {
	f.t.Helper()
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		mn := &v1alpha1.MacNode{}
		if err := f.c.Get(f.t.Context(), client.ObjectKey{Name: name}, mn); err != nil {
			return false, err.Error()
		}
		meta.SetStatusCondition(&mn.Status.Conditions, metav1.Condition{Type: v1alpha1.MacNodeReady, Status: status,
			Reason: "Test", Message: "set by the test"})
		if err := f.c.Status().Update(f.t.Context(), mn); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// markLoaded plays the agent of a replica whose runner holds the model: Loaded and
// Ready are True.
func (f *fixture) markLoaded(mr *v1alpha1.ModelReplica) {
	f.t.Helper()
	f.markReady(mr)
	f.reportLoaded(mr, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady, nil)
}

// reportLoaded plays the agent: it writes the replica's Loaded condition for its
// current generation and, when unload is set, its lastUnload; a replica no longer
// loaded is not Ready either.
func (f *fixture) reportLoaded(mr *v1alpha1.ModelReplica, status metav1.ConditionStatus, reason string, unload *v1alpha1.UnloadReport) {
	f.t.Helper()
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		if err := f.c.Get(f.t.Context(), client.ObjectKeyFromObject(mr), mr); err != nil {
			return false, err.Error()
		}
		meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{Type: v1alpha1.ReplicaLoaded, Status: status,
			Reason: reason, Message: "set by the test", ObservedGeneration: mr.Generation})
		if status != metav1.ConditionTrue {
			meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{Type: v1alpha1.ReplicaReady, Status: status,
				Reason: reason, Message: "set by the test", ObservedGeneration: mr.Generation})
		}
		if unload != nil {
			mr.Status.LastUnload = unload
		}
		if err := f.c.Status().Update(f.t.Context(), mr); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// waitDraining waits for a replica with spec.drain set and returns it.
func (f *fixture) waitDraining() v1alpha1.ModelReplica {
	f.t.Helper()
	var found v1alpha1.ModelReplica
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		for _, r := range f.replicas() {
			if r.Spec.Drain != nil && r.DeletionTimestamp == nil {
				found = r
				return true, ""
			}
		}
		return false, "no replica is draining"
	})
	return found
}

// watchDeletions watches the namespace's replicas from now on; the function it
// returns waits for the deletion of the named replica and returns the replica's last
// state, as the API server had it when it was deleted.
func (f *fixture) watchDeletions() func(name string) *v1alpha1.ModelReplica {
	f.t.Helper()
	wc, err := client.NewWithWatch(apiServer(f.t).Config, client.Options{Scheme: apiServer(f.t).Scheme})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	w, err := wc.Watch(ctx, &v1alpha1.ModelReplicaList{}, client.InNamespace(f.ns))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	return func(name string) *v1alpha1.ModelReplica {
		f.t.Helper()
		deadline := time.After(wait)
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					f.t.Fatalf("the watch ended before replica %s was deleted", name)
				}
				if mr, isReplica := ev.Object.(*v1alpha1.ModelReplica); isReplica && ev.Type == watch.Deleted && mr.Name == name {
					return mr
				}
			case <-deadline:
				f.t.Fatalf("replica %s was not deleted within %s: %v", name, wait, names(f.replicas()))
			}
		}
	}
}

// waitEvent waits for an Event of reason in the namespace whose note is note.
func (f *fixture) waitEvent(reason, note string) {
	f.t.Helper()
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		var list eventsv1.EventList
		if err := f.c.List(f.t.Context(), &list, client.InNamespace(f.ns)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range list.Items {
			if ev.Reason == reason && ev.Note == note {
				return true, ""
			}
			seen = append(seen, ev.Reason+": "+ev.Note)
		}
		return false, "events: " + strings.Join(seen, "; ")
	})
}

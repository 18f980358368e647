package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/modeldeployment"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestScaleDownDrainsUnderLoad: scaling 2→1 while requests flow drains the replica
// it removes — out of the gateway's routing, its requests finished, its model
// unloaded and measured — before deleting it: no request fails, the replica's last
// state before its deletion records the unload, and the deployment's Event names it.
// Both replicas run on the same Mac: the one kept serves while the other unloads, so
// the unload is measured as the runner's footprint (Indeterminate), never a host gauge
// drop that the noise of a shared test machine can hide.
func TestScaleDownDrainsUnderLoad(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "drained", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.MaxReplicasPerNode = 2
		md.Spec.Placement.NodeSelector = map[string]string{v1alpha1.LabelMemoryGiB: "64"} // mac-studio-1
	}))
	waitReady(t, ns, "drained", 2, 3*time.Minute)

	wc, err := client.NewWithWatch(fleet.Env.Config, client.Options{Scheme: fleet.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	w, err := wc.Watch(ctx, &v1alpha1.ModelReplicaList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	l := startLoad(t.Context(), ns+"/drained", 3)
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		return l.ok.Load() >= 4, "four requests served before the scale-down"
	})
	scale(t, ns, "drained", 1)

	// Follow the replicas until one is deleted; it must have been drained first.
	var drainedSeen bool
	var gone *v1alpha1.ModelReplica
	for gone == nil {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the replica watch ended before a replica was deleted")
			}
			mr, isReplica := ev.Object.(*v1alpha1.ModelReplica)
			if !isReplica {
				continue
			}
			drainedSeen = drainedSeen || (ev.Type == watch.Modified && mr.Spec.Drain != nil)
			if ev.Type == watch.Deleted {
				gone = mr
			}
		case <-ctx.Done():
			t.Fatalf("no replica was deleted after the scale-down: %v", ctx.Err())
		}
	}
	if !drainedSeen || gone.Spec.Drain == nil {
		t.Errorf("replica %s was deleted without a drain", gone.Name)
	}
	u := gone.Status.LastUnload
	if u == nil || u.Reason != "Drained" || u.ResidentBytes <= 0 || u.Time.Before(&metav1.Time{Time: gone.Spec.Drain.Truncate(time.Second)}) {
		t.Fatalf("replica %s was deleted with lastUnload %+v, want the drain's unload recorded; %s", gone.Name, u,
			describeReplicas([]v1alpha1.ModelReplica{*gone}))
	}
	t.Logf("drained %s on %s: %+v", gone.Name, gone.Spec.NodeName, *u)
	if u.FreedBytes <= 0 {
		t.Errorf("the drain's unload freed %d bytes, want the measurement (> 0)", u.FreedBytes)
	}
	want := fmt.Sprintf("Replica %s drained and unloaded on %s, freed ", gone.Name, gone.Spec.NodeName)
	testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		var list eventsv1.EventList
		if err := fleet.Client.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range list.Items {
			if ev.Reason == modeldeployment.ReasonReplicaDrained && strings.HasPrefix(ev.Note, want) {
				return true, ""
			}
			seen = append(seen, ev.Reason+": "+ev.Note)
		}
		return false, fmt.Sprintf("no Event %q…; events: %v", want, seen)
	})

	waitReady(t, ns, "drained", 1, 2*time.Minute)
	served := l.ok.Load()
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		return l.ok.Load() >= served+2, "two requests after the drained replica went away"
	})
	ok, errs := l.finish()
	for _, err := range errs {
		t.Errorf("a failed request: %v", err)
	}
	t.Logf("%d requests served through the scale-down, %d failed", ok, len(errs))
}

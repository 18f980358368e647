package clustermode_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestDrainedReplica: once the deployment controller sets spec.drain, the agent
// unloads a loaded replica, reports Loaded=False/Drained with the unload measured in
// status.lastUnload, and keeps it unloaded: a request routed to it late gets the
// pool's draining 503 and loads nothing — an OnDemand replica is not loaded on demand
// either. Deleting the replica then removes its pool entry.
func TestDrainedReplica(t *testing.T) {
	a := startAgent(t, agentOptions{})
	ns := testenv.NewNamespace(t, env.Client)
	newReplica(t, ns, "res-0", a.node, replicaOpts{deployment: "res"})
	newReplica(t, ns, "od-0", a.node, replicaOpts{deployment: "od", residency: v1alpha1.ResidencyOnDemand})
	waitReplica(t, 2*time.Minute, ns, "res-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaLoaded, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
	})
	waitReplica(t, time.Minute, ns, "od-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand)
	})

	drainAt := time.Now()
	for _, name := range []string{"res-0", "od-0"} {
		mr := getReplica(t, ns, name)
		before := mr.DeepCopy()
		mr.Spec.Drain = &metav1.Time{Time: drainAt}
		if err := env.Client.Patch(t.Context(), mr, client.MergeFrom(before)); err != nil {
			t.Fatalf("setting the drain of %s: %v", name, err)
		}
	}

	res := waitReplica(t, time.Minute, ns, "res-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return drainedFor(mr, true)
	})
	if u := res.Status.LastUnload; u.Reason != "Drained" || u.ResidentBytes <= 0 || u.Time.Before(&metav1.Time{Time: drainAt.Truncate(time.Second)}) {
		t.Errorf("res-0 lastUnload %+v, want the drain's unload (reason Drained) with its measurement", u)
	}
	waitReplica(t, time.Minute, ns, "od-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return drainedFor(mr, false)
	})

	for _, name := range []string{"res-0", "od-0"} {
		code, body := a.chat(name, append([]string{v1alpha1.HeaderReplica, ns + "/" + name}, auth...)...)
		if code != http.StatusServiceUnavailable || errorCode(body) != enginepool.CodeModelDraining {
			t.Errorf("chat to drained %s: %d %s, want 503 %s", name, code, body, enginepool.CodeModelDraining)
		}
		m, ok := a.model(ns + "/" + name)
		if !ok || !m.Retired || (m.State != enginepool.StateUnloaded && m.State != enginepool.StateAbsent) {
			t.Errorf("pool entry of %s after a late request: %+v, want retired and not loaded", name, m)
		}
	}

	for _, name := range []string{"res-0", "od-0"} {
		if err := env.Client.Delete(t.Context(), getReplica(t, ns, name)); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
			m, ok := a.model(ns + "/" + name)
			return !ok, fmt.Sprintf("the pool still has %s: %+v", name, m)
		})
	}
}

// drainedFor says whether mr's status is the agent's report of a finished drain:
// phase Draining, not Ready, Loaded=False/Drained for the current generation and,
// when wantUnload, a lastUnload.
func drainedFor(mr *v1alpha1.ModelReplica, wantUnload bool) (bool, string) {
	if mr.Status.Phase != v1alpha1.ReplicaDraining {
		return false, "phase " + string(mr.Status.Phase)
	}
	if ok, msg := condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonDraining); !ok {
		return false, msg
	}
	if ok, msg := condIs(mr, v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonDrained); !ok {
		return false, msg
	}
	for _, c := range mr.Status.Conditions {
		if c.Type == v1alpha1.ReplicaLoaded && c.ObservedGeneration != mr.Generation {
			return false, fmt.Sprintf("Loaded written for generation %d, the replica is at %d", c.ObservedGeneration, mr.Generation)
		}
	}
	if wantUnload && mr.Status.LastUnload == nil {
		return false, "no lastUnload"
	}
	return true, ""
}

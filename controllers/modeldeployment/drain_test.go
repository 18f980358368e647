package modeldeployment

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// removing builds a replica for decideRemoval: node "" is unbound; loaded sets its
// Loaded condition True; drainAt, when not zero, is when its drain began.
func removing(node string, loaded bool, drainAt time.Time) *v1alpha1.ModelReplica {
	mr := &v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Name: "r", Generation: 2},
		Spec: v1alpha1.ModelReplicaSpec{NodeName: node}}
	if !drainAt.IsZero() {
		mr.Spec.Drain = &metav1.Time{Time: drainAt}
	}
	status := metav1.ConditionFalse
	if loaded {
		status = metav1.ConditionTrue
	}
	mr.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ReplicaLoaded, Status: status, Reason: v1alpha1.ReasonRunnerReady,
		ObservedGeneration: 1}}
	return mr
}

// reportsLoaded sets the Loaded condition as the agent writes it for generation gen.
func reportsLoaded(mr *v1alpha1.ModelReplica, status metav1.ConditionStatus, reason string, gen int64) *v1alpha1.ModelReplica {
	mr.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ReplicaLoaded, Status: status, Reason: reason, ObservedGeneration: gen}}
	return mr
}

// splitDrained makes mr a replica split over its node and workers, whose head reports
// Drained for generation 2; unloads gives each worker's entry of status.shards: a
// lastUnload at that time, or (zero time) a Failed entry with none.
func splitDrained(mr *v1alpha1.ModelReplica, unloads map[string]time.Time, workers ...string) *v1alpha1.ModelReplica {
	reportsLoaded(mr, metav1.ConditionFalse, v1alpha1.ReasonDrained, 2)
	mr.Spec.Split = &v1alpha1.ReplicaSplit{Shards: []v1alpha1.ReplicaShard{{Node: mr.Spec.NodeName}}}
	for _, w := range workers {
		mr.Spec.Split.Shards = append(mr.Spec.Split.Shards, v1alpha1.ReplicaShard{Node: w})
		at, ok := unloads[w]
		switch {
		case !ok:
		case at.IsZero():
			mr.Status.Shards = append(mr.Status.Shards, v1alpha1.ShardStatus{Node: w, Phase: v1alpha1.ReplicaFailed})
		default:
			mr.Status.Shards = append(mr.Status.Shards, v1alpha1.ShardStatus{Node: w, Phase: v1alpha1.ReplicaDraining,
				LastUnload: &v1alpha1.UnloadReport{FreedBytes: 100 << 20, Time: metav1.NewTime(at)}})
		}
	}
	return mr
}

func TestDecideRemoval(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	const timeout = 2 * time.Minute
	began := t0.Add(-30 * time.Second)
	tests := []struct {
		name      string
		mr        *v1alpha1.ModelReplica
		nodeReady bool
		want      removal
	}{
		// Chosen for removal.
		{"unbound: nothing to drain", removing("", false, time.Time{}), false, removal{Action: removalDelete, Why: removedUnbound}},
		{"Mac not Ready: no one to drain it", removing("mac-1", true, time.Time{}), false,
			removal{Action: removalDelete, Why: removedNodeDown}},
		{"not loaded: nothing in memory", removing("mac-1", false, time.Time{}), true,
			removal{Action: removalDelete, Why: removedNotLoaded}},
		{"loaded on a Ready Mac: drain", removing("mac-1", true, time.Time{}), true, removal{Action: removalDrain}},

		// Draining.
		{"draining: wait the rest of the timeout", removing("mac-1", true, began), true,
			removal{Action: removalWait, Wait: 90 * time.Second}},
		{"unloading for the drain: wait",
			reportsLoaded(removing("mac-1", false, began), metav1.ConditionFalse, v1alpha1.ReasonDraining, 2), true,
			removal{Action: removalWait, Wait: 90 * time.Second}},
		{"the agent reports the unload: delete",
			reportsLoaded(removing("mac-1", false, began), metav1.ConditionFalse, v1alpha1.ReasonDrained, 2), true,
			removal{Action: removalDelete, Why: removedDrained}},
		{"a report written before the drain does not count",
			reportsLoaded(removing("mac-1", false, began), metav1.ConditionFalse, v1alpha1.ReasonDrained, 1), true,
			removal{Action: removalWait, Wait: 90 * time.Second}},
		{"drained on a Mac that went down: still drained",
			reportsLoaded(removing("mac-1", false, began), metav1.ConditionFalse, v1alpha1.ReasonDrained, 2), false,
			removal{Action: removalDelete, Why: removedDrained}},
		{"the Mac stops being Ready: delete", removing("mac-1", true, began), false,
			removal{Action: removalDelete, Why: removedNodeDown}},
		{"timed out: delete", removing("mac-1", true, t0.Add(-timeout)), true,
			removal{Action: removalDelete, Why: removedTimedOut}},
		// Draining a split replica: deleted once the head and every worker shard's Mac
		// report their unloads.
		{"split: the head drained, a worker has not reported: wait",
			splitDrained(removing("mac-1", false, began), map[string]time.Time{"mac-2": t0}, "mac-2", "mac-3"), true,
			removal{Action: removalWait, Wait: 90 * time.Second}},
		{"split: every worker reports its unload since the drain: delete",
			splitDrained(removing("mac-1", false, began), map[string]time.Time{"mac-2": t0, "mac-3": began}, "mac-2", "mac-3"), true,
			removal{Action: removalDelete, Why: removedDrained}},
		{"split: a worker's unload before the drain does not count",
			splitDrained(removing("mac-1", false, began), map[string]time.Time{"mac-2": began.Add(-time.Second)}, "mac-2"), true,
			removal{Action: removalWait, Wait: 90 * time.Second}},
		{"split: a failed worker shard has nothing to unload",
			splitDrained(removing("mac-1", false, began), map[string]time.Time{"mac-2": {}}, "mac-2"), true,
			removal{Action: removalDelete, Why: removedDrained}},
		{"split: the workers unloaded but the head has not: wait",
			reportsLoaded(splitDrained(removing("mac-1", false, began), map[string]time.Time{"mac-2": t0}, "mac-2"),
				metav1.ConditionFalse, v1alpha1.ReasonDraining, 2), true,
			removal{Action: removalWait, Wait: 90 * time.Second}},
		{"a second before the timeout: wait", removing("mac-1", true, t0.Add(-timeout+time.Second)), true,
			removal{Action: removalWait, Wait: time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decideRemoval(tt.mr, tt.nodeReady, clk.Now(), timeout)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("decideRemoval (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDrainTimeoutFollowsTheClock: the same draining replica waits, then times out,
// as the clock moves.
func TestDrainTimeoutFollowsTheClock(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	mr := removing("mac-1", true, t0)
	if got := decideRemoval(mr, true, clk.Now(), time.Minute); got.Action != removalWait || got.Wait != time.Minute {
		t.Fatalf("at the start of the drain: %+v, want to wait 1m", got)
	}
	clk.SetTime(t0.Add(59 * time.Second))
	if got := decideRemoval(mr, true, clk.Now(), time.Minute); got.Action != removalWait || got.Wait != time.Second {
		t.Fatalf("59s in: %+v, want to wait 1s", got)
	}
	clk.SetTime(t0.Add(time.Minute))
	if got := decideRemoval(mr, true, clk.Now(), time.Minute); got.Action != removalDelete || got.Why != removedTimedOut {
		t.Fatalf("at the timeout: %+v, want a delete", got)
	}
}

func TestRemovedNote(t *testing.T) {
	drainAt := t0.Add(500 * time.Millisecond)
	mr := reportsLoaded(removing("mac-1", false, drainAt), metav1.ConditionFalse, v1alpha1.ReasonDrained, 2)
	mr.Name = "m-abc-x"
	// lastUnload has one-second resolution: an unload in the drain's second counts.
	mr.Status.LastUnload = &v1alpha1.UnloadReport{FreedBytes: 312 << 20, Time: metav1.NewTime(t0)}
	if got, want := removedNote(mr, removedDrained, time.Minute), "Replica m-abc-x drained and unloaded on mac-1, freed 312.0 MiB"; got != want {
		t.Errorf("note = %q, want %q", got, want)
	}
	mr.Status.LastUnload.Time = metav1.NewTime(t0.Add(-time.Second)) // an earlier unload (idle)
	if got := removedNote(mr, removedDrained, time.Minute); strings.Contains(got, "freed") {
		t.Errorf("note = %q reports the freed bytes of an unload before the drain", got)
	}
	split := splitDrained(reportsLoaded(removing("mac-1", false, drainAt), metav1.ConditionFalse, v1alpha1.ReasonDrained, 2),
		map[string]time.Time{"mac-2": t0}, "mac-2", "mac-3")
	split.Name, split.Status.LastUnload = "m-abc-y", &v1alpha1.UnloadReport{FreedBytes: 50 << 20, Time: metav1.NewTime(t0)}
	if got, want := removedNote(split, removedDrained, time.Minute),
		"Replica m-abc-y drained and unloaded on mac-1, freed 50.0 MiB; its worker shards: mac-2 freed 100.0 MiB, mac-3 reported no unload"; got != want {
		t.Errorf("split note = %q, want %q", got, want)
	}
	if got := removedNote(mr, removedTimedOut, time.Minute); !strings.Contains(got, "within 1m0s") {
		t.Errorf("timeout note = %q, want the timeout named", got)
	}
	if got := removedNote(mr, removedNodeDown, time.Minute); !strings.Contains(got, "mac-1 is not Ready") {
		t.Errorf("node-down note = %q, want the Mac named", got)
	}
}

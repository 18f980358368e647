package clustermode

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

func TestWorkerShardOf(t *testing.T) {
	split := func(nodes ...string) *v1alpha1.ModelReplica {
		mr := &v1alpha1.ModelReplica{}
		mr.Spec.NodeName = nodes[0]
		if len(nodes) > 1 {
			mr.Spec.Split = &v1alpha1.ReplicaSplit{}
			for i, n := range nodes {
				mr.Spec.Split.Shards = append(mr.Spec.Split.Shards, v1alpha1.ReplicaShard{Node: n, FirstLayer: int32(i), LastLayer: int32(i)})
			}
		}
		return mr
	}
	deleting := split("h", "w")
	deleting.DeletionTimestamp = &metav1.Time{}
	for _, tc := range []struct {
		name      string
		mr        *v1alpha1.ModelReplica
		node      string
		wantLayer int32 // -1: none
	}{
		{"a worker shard", split("h", "w"), "w", 1},
		{"the second worker", split("h", "w1", "w2"), "w2", 2},
		{"the head's Mac runs the runner, not a worker", split("h", "w"), "h", -1},
		{"no shard here", split("h", "w"), "x", -1},
		{"not split", split("h"), "h", -1},
		{"being deleted", deleting, "w", -1},
	} {
		got := workerShardOf(tc.mr, tc.node)
		switch {
		case tc.wantLayer < 0 && got != nil:
			t.Errorf("%s: %+v, want none", tc.name, got)
		case tc.wantLayer >= 0 && (got == nil || got.FirstLayer != tc.wantLayer):
			t.Errorf("%s: %+v, want the shard of layer %d", tc.name, got, tc.wantLayer)
		}
	}
}

func TestShardPhase(t *testing.T) {
	for _, tc := range []struct {
		name     string
		m        *enginepool.ModelSnapshot
		fetchErr error
		want     v1alpha1.ReplicaPhase
	}{
		{"fetching", nil, nil, v1alpha1.ReplicaDownloading},
		{"fetch failed", nil, errors.New("no such file"), v1alpha1.ReplicaFailed},
		{"loading", &enginepool.ModelSnapshot{State: enginepool.StateLoading}, nil, v1alpha1.ReplicaLoading},
		{"running", &enginepool.ModelSnapshot{State: enginepool.StateReady}, nil, v1alpha1.ReplicaRunning},
		{"the worker died", &enginepool.ModelSnapshot{State: enginepool.StateFailed}, nil, v1alpha1.ReplicaFailed},
		{"being stopped", &enginepool.ModelSnapshot{State: enginepool.StateStopping}, nil, v1alpha1.ReplicaLoading},
	} {
		if got := shardPhase(tc.m, tc.fetchErr); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	e := shardEntry("w", v1alpha1.ReplicaRunning, &enginepool.ModelSnapshot{ResidentBytes: 3 << 20, PeakBytes: 5 << 20})
	if e.Node != "w" || e.Resident.Value() != 3<<20 || e.Peak.Value() != 5<<20 {
		t.Errorf("shardEntry = %+v", e)
	}
	if !sameShardEntry([]v1alpha1.ShardStatus{e}, shardEntry("w", v1alpha1.ReplicaRunning, &enginepool.ModelSnapshot{ResidentBytes: 3<<20 + 1000, PeakBytes: 5 << 20})) {
		t.Error("a drift under 1 MiB counts as a change")
	}
	if sameShardEntry([]v1alpha1.ShardStatus{e}, shardEntry("w", v1alpha1.ReplicaFailed, nil)) {
		t.Error("a new phase counts as no change")
	}
}

// TestShardRetires: a worker shard is unloaded for good only once its replica drains
// and the head's agent reports the head's runner unloaded for the current spec.
func TestShardRetires(t *testing.T) {
	drain := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	mk := func(drain *metav1.Time, status metav1.ConditionStatus, reason string, observed int64) *v1alpha1.ModelReplica {
		mr := splitReplica(v1alpha1.ReplicaRunning, v1alpha1.ReplicaRunning)
		mr.Generation, mr.Spec.Drain = 3, drain
		mr.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ReplicaLoaded, Status: status, Reason: reason, ObservedGeneration: observed}}
		return mr
	}
	for _, tc := range []struct {
		name string
		mr   *v1alpha1.ModelReplica
		want bool
	}{
		{"serving", mk(nil, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady, 3), false},
		{"draining: the head still finishes its requests", mk(&drain, metav1.ConditionFalse, v1alpha1.ReasonDraining, 3), false},
		{"the head reports Drained", mk(&drain, metav1.ConditionFalse, v1alpha1.ReasonDrained, 3), true},
		{"a Drained written before the drain", mk(&drain, metav1.ConditionFalse, v1alpha1.ReasonDrained, 2), false},
		{"Drained without a drain", mk(nil, metav1.ConditionFalse, v1alpha1.ReasonDrained, 3), false},
	} {
		if got := shardRetires(tc.mr); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestShardEntryReportsItsUnload: a shard's entry carries its pool entry's last
// unload, as replica status shows it, and a new unload is a change to write.
func TestShardEntryReportsItsUnload(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 700e6, time.UTC)
	m := &enginepool.ModelSnapshot{State: enginepool.StateUnloaded, Retired: true, LastUnload: &enginepool.UnloadReport{
		Reason: enginepool.ReasonRetired, FreedBytes: 90 << 20, ResidentBytes: 100 << 20, Outcome: enginepool.Settled,
		Duration: 2 * time.Second, Time: at}}
	e := shardEntry("w", v1alpha1.ReplicaDraining, m)
	want := &v1alpha1.UnloadReport{Reason: "Drained", FreedBytes: 90 << 20, ResidentBytes: 100 << 20, Outcome: v1alpha1.UnloadSettled,
		Duration: metav1.Duration{Duration: 2 * time.Second}, Time: metav1.NewTime(at.Truncate(time.Second))}
	if e.Resident != nil || e.Peak != nil || !cmp.Equal(e.LastUnload, want) {
		t.Errorf("entry of a retired shard %+v (lastUnload %+v), want no footprint and lastUnload %+v", e, e.LastUnload, want)
	}
	before := shardEntry("w", v1alpha1.ReplicaDraining, &enginepool.ModelSnapshot{State: enginepool.StateStopping})
	if sameShardEntry([]v1alpha1.ShardStatus{before}, e) {
		t.Error("an unload reported counts as no change")
	}
	if !sameShardEntry([]v1alpha1.ShardStatus{e}, shardEntry("w", v1alpha1.ReplicaDraining, m)) {
		t.Error("the same unload counts as a change")
	}
}

// TestSplitHeadDrainStatus: a draining split head reports its own entry Draining,
// with its runner's unload in both status.lastUnload and its entry.
func TestSplitHeadDrainStatus(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mr := splitReplica(v1alpha1.ReplicaRunning, v1alpha1.ReplicaRunning)
	mr.Spec.Drain = &metav1.Time{Time: now}
	m := &enginepool.ModelSnapshot{State: enginepool.StateUnloaded, Retired: true, LastUnload: &enginepool.UnloadReport{
		Reason: enginepool.ReasonRetired, FreedBytes: 40 << 20, ResidentBytes: 45 << 20, Outcome: enginepool.Settled, Time: now}}
	st := ownedStatus(mr, &localView{phase: phaseRegistered, hash: "h1"}, m, "e:1", now)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ReplicaLoaded); c == nil || c.Reason != v1alpha1.ReasonDrained {
		t.Fatalf("Loaded = %+v, want Drained", c)
	}
	if len(st.Shards) != 1 || st.Shards[0].Node != "mac" || st.Shards[0].Phase != v1alpha1.ReplicaDraining ||
		st.LastUnload == nil || !cmp.Equal(st.Shards[0].LastUnload, st.LastUnload) || st.LastUnload.FreedBytes != 40<<20 {
		t.Errorf("owned shards %+v, lastUnload %+v: want the head's entry Draining with its 40 MiB unload", st.Shards, st.LastUnload)
	}
}

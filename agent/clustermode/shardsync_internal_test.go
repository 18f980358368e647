package clustermode

import (
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/enginepool"
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

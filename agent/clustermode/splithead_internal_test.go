package clustermode

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// splitReplica is testReplica split over mac (the head, layers 0-9), mac-b (10-19)
// and mac-c (20-23), with the workers' status.shards phases given (absent: "").
func splitReplica(phaseB, phaseC v1alpha1.ReplicaPhase) *v1alpha1.ModelReplica {
	mr := testReplica(v1alpha1.ResidencyResident)
	mr.Spec.Split = &v1alpha1.ReplicaSplit{Shards: []v1alpha1.ReplicaShard{
		{Node: "mac", FirstLayer: 0, LastLayer: 9, Memory: resource.MustParse("40Mi")},
		{Node: "mac-b", FirstLayer: 10, LastLayer: 19, Memory: resource.MustParse("20Mi")},
		{Node: "mac-c", FirstLayer: 20, LastLayer: 23, Memory: resource.MustParse("8Mi")},
	}}
	for node, phase := range map[string]v1alpha1.ReplicaPhase{"mac-b": phaseB, "mac-c": phaseC} {
		if phase != "" {
			mr.Status.Shards = append(mr.Status.Shards, v1alpha1.ShardStatus{Node: node, Phase: phase})
		}
	}
	return mr
}

// TestSplitWaitingFor: the head waits for the first worker shard in layer order that
// its Mac has not reported Ready; a replica not split waits for nothing.
func TestSplitWaitingFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		mr   *v1alpha1.ModelReplica
		want string
	}{
		{"not split", testReplica(v1alpha1.ResidencyResident), ""},
		{"no worker reported", splitReplica("", ""), "mac-b"},
		{"the first loading", splitReplica(v1alpha1.ReplicaLoading, v1alpha1.ReplicaRunning), "mac-b"},
		{"the second not reported", splitReplica(v1alpha1.ReplicaRunning, ""), "mac-c"},
		{"the second failed", splitReplica(v1alpha1.ReplicaRunning, v1alpha1.ReplicaFailed), "mac-c"},
		{"every worker ready", splitReplica(v1alpha1.ReplicaRunning, v1alpha1.ReplicaRunning), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if s := splitWaitingFor(tc.mr); s != nil {
				got = s.Node
			}
			if got != tc.want {
				t.Errorf("waiting for %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSplitGate: while a worker shard is not Ready nothing is registered or loaded;
// other actions go ahead, and a gang whose workers are all Ready acts as any replica.
func TestSplitGate(t *testing.T) {
	waiting, ready := splitReplica(v1alpha1.ReplicaRunning, ""), splitReplica(v1alpha1.ReplicaRunning, v1alpha1.ReplicaRunning)
	for _, tc := range []struct {
		mr   *v1alpha1.ModelReplica
		in   Action
		want Action
	}{
		{waiting, ActionRegisterLoad, ActionNone},
		{waiting, ActionRegister, ActionNone},
		{waiting, ActionLoad, ActionNone},
		{waiting, ActionRetryLoad, ActionNone},
		{waiting, ActionFetch, ActionFetch},
		{waiting, ActionRemove, ActionRemove},
		{waiting, ActionRetire, ActionRetire},
		{waiting, ActionUpdate, ActionUpdate},
		{ready, ActionRegisterLoad, ActionRegisterLoad},
		{ready, ActionLoad, ActionLoad},
		{testReplica(v1alpha1.ResidencyResident), ActionRegisterLoad, ActionRegisterLoad},
		{nil, ActionRemove, ActionRemove},
	} {
		if got := splitGate(tc.in, tc.mr); got != tc.want {
			t.Errorf("splitGate(%s) of %v = %s, want %s", tc.in, tc.mr != nil && tc.mr.Spec.Split != nil, got, tc.want)
		}
	}
}

// TestSplitHeadSpec: the head's runner reserves the head shard's memory and computes
// each worker shard's layers at its split link address, in layer order.
func TestSplitHeadSpec(t *testing.T) {
	base := enginepool.ModelSpec{Name: "ns/r", Path: "/m.gguf", EstimatedBytes: 64 << 20}
	addrs := map[string]enginepool.SplitWorker{"mac-b": {Addr: "127.0.0.1:40001", Token: []byte("b")}, "mac-c": {Addr: "127.0.0.1:40002", Token: []byte("c")}}
	got := splitHeadSpec(base, splitReplica("", ""), addrs)
	want := base
	want.EstimatedBytes = 40 << 20
	want.SplitWorkers = []enginepool.SplitWorker{{Addr: "127.0.0.1:40001", Layers: 10, Token: []byte("b")}, {Addr: "127.0.0.1:40002", Layers: 4, Token: []byte("c")}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("split head spec (-want +got):\n%s", d)
	}
	if got := splitHeadSpec(base, testReplica(v1alpha1.ResidencyResident), addrs); !cmp.Equal(got, base) {
		t.Errorf("a replica not split got %+v, want its spec unchanged", got)
	}
}

// TestSplitHeadStatus: a stored head waiting for a worker is not Ready, with a reason
// naming the shard, and reports its own status.shards entry; applyOwned keeps the
// workers' entries and replaces only the head's.
func TestSplitHeadStatus(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	stored := &localView{phase: phaseDownloaded, hash: "h1", path: "/m.gguf"}
	mr := splitReplica(v1alpha1.ReplicaRunning, v1alpha1.ReplicaLoading)
	st := ownedStatus(mr, stored, nil, "e:1", now)
	ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ReplicaReady)
	if ready == nil || ready.Status != "False" || ready.Reason != v1alpha1.ReasonWaitingForShard || !strings.Contains(ready.Message, "mac-c (layers 20-23)") {
		t.Errorf("Ready = %+v, want False/%s naming mac-c's shard", ready, v1alpha1.ReasonWaitingForShard)
	}
	if want := []v1alpha1.ShardStatus{{Node: "mac", Phase: v1alpha1.ReplicaLoading}}; !cmp.Equal(st.Shards, want) {
		t.Errorf("owned shards %+v, want %+v", st.Shards, want)
	}

	all := splitReplica(v1alpha1.ReplicaRunning, v1alpha1.ReplicaRunning)
	running := &enginepool.ModelSnapshot{State: enginepool.StateReady, ResidentBytes: 30 << 20}
	st = ownedStatus(all, &localView{phase: phaseRegistered, hash: "h1", path: "/m.gguf"}, running, "e:1", now)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ReplicaReady); c == nil || c.Status != "True" {
		t.Errorf("Ready = %+v once every shard is Ready and the runner serves, want True", c)
	}
	applyOwned(&all.Status, st, now)
	got := map[string]v1alpha1.ReplicaPhase{}
	for _, s := range all.Status.Shards {
		got[s.Node] = s.Phase
	}
	want := map[string]v1alpha1.ReplicaPhase{"mac": v1alpha1.ReplicaRunning, "mac-b": v1alpha1.ReplicaRunning, "mac-c": v1alpha1.ReplicaRunning}
	if !cmp.Equal(got, want) || len(all.Status.Shards) != 3 {
		t.Errorf("status.shards after the head's write %+v, want one entry each %v", all.Status.Shards, want)
	}
	if e := all.Status.Shards[2]; e.Node != "mac" || e.Resident == nil || e.Resident.Value() != 30<<20 {
		t.Errorf("the head's entry %+v, want its runner's resident bytes", e)
	}
}

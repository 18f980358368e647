package scheduler

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// apiSplit is a split over nodes, each shard holding memGiB[i] GiB.
func apiSplit(nodes []string, memGiB ...float64) *v1alpha1.ReplicaSplit {
	s := &v1alpha1.ReplicaSplit{}
	for i, n := range nodes {
		s.Shards = append(s.Shards, v1alpha1.ReplicaShard{Node: n, FirstLayer: int32(i), LastLayer: int32(i), Memory: *qty(memGiB[i])})
	}
	return s
}

// TestGangView maps split replicas to the snapshot: every shard counts on its own
// node, bound or only assumed (the cache lags the scheduler's own write); a pending
// replica takes its deployment's maxMacsPerReplica and its own layerMemory.
func TestGangView(t *testing.T) {
	nodes := []v1alpha1.MacNode{apiNode("a", 64), apiNode("b", 64), apiNode("c", 64, func(n *v1alpha1.MacNode) {
		n.Spec.Link = &v1alpha1.Link{Bandwidth: resource.NewQuantity(80e9, resource.DecimalSI)}
	})}
	bound := apiReplica("bound", "big", 100, "a", func(r *v1alpha1.ModelReplica) { r.Spec.Split = apiSplit([]string{"a", "b"}, 50, 48) })
	assumed := apiReplica("assumed", "big", 100, "")
	pending := apiReplica("pending", "big", 100, "", func(r *v1alpha1.ModelReplica) {
		r.Spec.LayerMemory = &v1alpha1.LayerMemory{Layers: 80, PerLayer: *qty(1.2), Head: *qty(4), Worker: *qty(0.5)}
	})
	deps := []v1alpha1.ModelDeployment{apiDeployment("big", v1alpha1.Placement{MaxMacsPerReplica: 3})}
	v := buildGangView(nodes, []v1alpha1.ModelReplica{bound, assumed, pending}, deps,
		func(r *v1alpha1.ModelReplica) (string, *v1alpha1.ReplicaSplit) {
			if r.Name == "assumed" {
				return "c", apiSplit([]string{"c", "b"}, 40, 10)
			}
			return "", nil
		})
	got := map[string][3]int64{}
	for _, n := range v.snap.Nodes {
		got[n.Name] = [3]int64{n.Committed, int64(n.ReplicasByDeployment["ns/big"]), n.LinkBandwidth}
	}
	want := map[string][3]int64{
		"a": {qty(50).Value(), 1, 0},
		"b": {qty(48 + 10).Value(), 2, 0},
		"c": {qty(40).Value(), 1, 80e9},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("nodes {committed, replicas of ns/big, link} (-want +got):\n%s", diff)
	}
	if len(v.snap.Pending) != 1 {
		t.Fatalf("pending %+v, want only ns/pending", v.snap.Pending)
	}
	p := v.snap.Pending[0]
	if wantL := (LayerModel{Layers: 80, PerLayer: qty(1.2).Value(), Head: qty(4).Value(), Worker: qty(0.5).Value()}); p.MaxNodes != 3 || p.Layers != wantL {
		t.Errorf("pending: maxNodes %d, layers %+v; want 3, %+v", p.MaxNodes, p.Layers, wantL)
	}
	// Quotas are charged what the shards reserve together, assumed gangs included.
	fq := v1alpha1.FleetQuota{Spec: v1alpha1.FleetQuotaSpec{Memory: *qty(500)}}
	fq.Namespace, fq.Name = "ns", "q"
	q := quotaSnapshot([]v1alpha1.FleetQuota{fq}, v.bound)
	if got, want := q["ns"].Used, qty(98+50).Value(); got != want {
		t.Errorf("quota used %d, want %d (the shards of both gangs)", got, want)
	}
	if got, want := QuotaCharge(&bound), qty(98).Value(); got != want {
		t.Errorf("QuotaCharge of a bound gang = %d, want its shards' %d", got, want)
	}
}

// TestLedgerAssumesGangs: a gang binding counts with its split until the cache shows
// the replica bound.
func TestLedgerAssumesGangs(t *testing.T) {
	var l ledger
	r := apiReplica("r", "big", 100, "")
	split := apiSplit([]string{"a", "b"}, 50, 48)
	l.boundAs(r.UID, "a", split)
	if node, got := l.assumed(&r); node != "a" || got != split {
		t.Errorf("assumed while the cache lags = %q, %+v; want a and the split", node, got)
	}
	r.Spec.NodeName, r.Spec.Split = "a", split
	if node, got := l.assumed(&r); node != "" || got != nil {
		t.Errorf("assumed once the cache shows the binding = %q, %+v; want nothing", node, got)
	}
	if l.len() != 0 {
		t.Errorf("the ledger keeps %d entries, want none", l.len())
	}
}

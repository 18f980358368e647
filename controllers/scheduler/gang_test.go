package scheduler

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// splitReplica is a reserving BinPack replica of ns/<dep> that may span maxNodes
// nodes: layers blocks of perLayer GiB, a head of head GiB and workers of worker GiB.
// Its memory is what one node holding it all would reserve.
func splitReplica(key, dep string, maxNodes int, layers int32, perLayer, head, worker float64) Replica {
	r := resident(key, dep, 0)
	r.MaxNodes = maxNodes
	r.Layers = LayerModel{Layers: layers, PerLayer: gb(perLayer), Head: gb(head), Worker: gb(worker)}
	r.Memory = r.Layers.Head + int64(layers)*r.Layers.PerLayer
	return r
}

func linked(n Node, gbps int64) Node { n.LinkBandwidth = gbps * 1e9; return n }

// shard is a gang Shard with memory in GiB.
func shard(node string, first, last int32, mem float64) Shard {
	return Shard{Node: node, FirstLayer: first, LastLayer: last, Memory: gb(mem)}
}

func TestSolveGang(t *testing.T) {
	// 60 layers of 1 GiB, a 4 GiB head, 0.5 GiB workers: 64 GiB on one Mac.
	big := func(key string, maxNodes int) Replica { return splitReplica(key, "big", maxNodes, 60, 1, 4, 0.5) }
	tests := []struct {
		name        string
		nodes       []Node
		pending     []Replica
		quotas      map[string]Quota
		want        []Binding
		unplaceable map[string]Reason
	}{
		{
			name:    "three Macs too small alone, two together fit",
			nodes:   []Node{mac("a", 40, 0), mac("b", 32, 2), mac("c", 20, 0)},
			pending: []Replica{big("r", 4)},
			// a (40 free) heads with room for 36 layers, b (30) works with room for
			// 29: 59 spare layers share 58, by room: a 1+35*58/63 → 33, b 27.
			want: []Binding{{Replica: "ns/r", Node: "a", Shards: []Shard{
				shard("a", 0, 32, 4+33), shard("b", 33, 59, 0.5+27),
			}}},
		},
		{
			name:    "a replica that fits one Mac is placed as before",
			nodes:   []Node{mac("a", 40, 0), mac("b", 70, 0)},
			pending: []Replica{big("r", 4)},
			want:    bindings("r", "b"),
		},
		{
			name:    "maxMacsPerReplica 1 never splits",
			nodes:   []Node{mac("a", 40, 0), mac("b", 40, 0)},
			pending: []Replica{big("r", 1)},
			unplaceable: map[string]Reason{"ns/r": {Code: ReasonInsufficientMemory,
				Message: "0/2 Macs fit: 2 insufficient memory (need 64.0GiB, largest free 40.0GiB)"}},
		},
		{
			name: "the fewest Macs, even when BinPack prefers smaller ones",
			// BinPack order is c, d, b, a; c+d+b would need 3 Macs, a+b hold it in 2.
			nodes:   []Node{mac("a", 40, 0), mac("b", 30, 0), mac("c", 22, 0), mac("d", 22, 0)},
			pending: []Replica{big("r", 4)},
			want: []Binding{{Replica: "ns/r", Node: "a", Shards: []Shard{
				shard("a", 0, 32, 4+33), shard("b", 33, 59, 0.5+27),
			}}},
		},
		{
			name: "among gangs of as many Macs, the fastest links",
			// c has the fastest link; with it, b (BinPack's first on 10G) holds the
			// rest, so a stays free. c (most free) heads.
			nodes:   []Node{linked(mac("a", 40, 0), 10), linked(mac("b", 30, 0), 10), linked(mac("c", 35, 0), 80)},
			pending: []Replica{big("r", 4)},
			want: []Binding{{Replica: "ns/r", Node: "c", Shards: []Shard{
				shard("c", 0, 30, 4+31), shard("b", 31, 59, 0.5+29),
			}}},
		},
		{
			name: "among equal links, BinPack takes the tightest Macs that hold it",
			// b (least free) and a hold it: c, the largest, stays free.
			nodes:   []Node{mac("a", 34, 0), mac("b", 32, 0), mac("c", 36, 0)},
			pending: []Replica{big("r", 4)},
			want: []Binding{{Replica: "ns/r", Node: "a", Shards: []Shard{
				shard("a", 0, 29, 4+30), shard("b", 30, 59, 0.5+30),
			}}},
		},
		{
			name: "three Macs when two do not hold it",
			nodes: []Node{mac("a", 25, 0), mac("b", 25, 0), mac("c", 25, 0),
				notReady(mac("d", 64, 0)), cordoned(mac("e", 64, 0))},
			pending: []Replica{big("r", 3)},
			// Equal Macs: the head is the first in BinPack's order (by name).
			want: []Binding{{Replica: "ns/r", Node: "a", Shards: []Shard{
				shard("a", 0, 17, 4+18), shard("b", 18, 38, 0.5+21), shard("c", 39, 59, 0.5+21),
			}}},
		},
		{
			name:    "no gang within maxMacsPerReplica",
			nodes:   []Node{mac("a", 25, 0), mac("b", 25, 0), mac("c", 25, 0)},
			pending: []Replica{big("r", 2)},
			unplaceable: map[string]Reason{"ns/r": {Code: ReasonInsufficientMemory,
				Message: "0/3 Macs fit: 3 insufficient memory (need 64.0GiB, largest free 25.0GiB); " +
					"no gang of up to 2 Macs: the 2 eligible Macs with the most free memory (of 3) have 50.0GiB free together, a gang of 2 needs 64.5GiB"}},
		},
		{
			name: "no gang in the fleet, nothing reserved",
			nodes: []Node{mac("a", 4, 1.1), mac("b", 4, 1), mac("c", 4, 1),
				notReady(mac("d", 64, 0))},
			pending: []Replica{splitReplica("r", "big", 4, 400, 1.25, 20, 1), resident("small", "other", 2)},
			want:    bindings("small", "a"),
			unplaceable: map[string]Reason{"ns/r": {Code: ReasonInsufficientMemory,
				Message: "0/4 Macs fit: 3 insufficient memory (need 520.0GiB, largest free 3.0GiB), 1 not ready; " +
					"no gang of up to 4 Macs: the 3 eligible Macs have 8.9GiB free together, a gang of 3 needs 522.0GiB"}},
		},
		{
			name: "free memory enough in sum but not in whole layers",
			// a heads with room for 2 layers of 4 GiB, b works with room for 1.
			nodes:   []Node{mac("a", 10.5, 0), mac("b", 8.5, 0)},
			pending: []Replica{splitReplica("r", "big", 2, 4, 4, 1, 1)},
			unplaceable: map[string]Reason{"ns/r": {Code: ReasonInsufficientMemory,
				Message: "0/2 Macs fit: 2 insufficient memory (need 17.0GiB, largest free 10.5GiB); " +
					"no gang of up to 2 Macs: the 2 eligible Macs have 19.0GiB free together, a gang of 2 needs 18.0GiB in whole layers of 4.0GiB"}},
		},
		{
			name: "a gang exactly filling two Macs but for their agents goes to others",
			// a (34 free) heads 30 layers, b (30.5) works 30: the 64.5 GiB gang fills
			// both exactly, leaving their agents nothing. c (36) heads 31 layers with
			// room for its agent, and b then works 29 with room for its own.
			nodes: []Node{withAgent(mac("a", 34, 0), 64), withAgent(mac("b", 30.5, 0), 64),
				withAgent(mac("c", 36, 0), 64), withAgent(mac("d", 36, 0), 64)},
			pending: []Replica{big("r", 2)},
			want: []Binding{{Replica: "ns/r", Node: "c", Shards: []Shard{
				shard("c", 0, 30, 4+31), shard("b", 31, 59, 0.5+29),
			}}},
		},
		{
			name:    "the same two Macs without their agents' share hold the gang exactly",
			nodes:   []Node{mac("a", 34, 0), mac("b", 30.5, 0), withAgent(mac("c", 36, 0), 64), withAgent(mac("d", 36, 0), 64)},
			pending: []Replica{big("r", 2)},
			want: []Binding{{Replica: "ns/r", Node: "a", Shards: []Shard{
				shard("a", 0, 29, 4+30), shard("b", 30, 59, 0.5+30),
			}}},
		},
		{
			name:    "a gang that fits only without the agents' share is unschedulable and says so",
			nodes:   []Node{withAgent(mac("a", 34, 0), 64), withAgent(mac("b", 30.5, 0), 64)},
			pending: []Replica{big("r", 2)},
			unplaceable: map[string]Reason{"ns/r": {Code: ReasonInsufficientMemory,
				Message: "0/2 Macs fit: 2 insufficient memory (need 64.0GiB, largest free 33.9GiB after its agent's own 64MiB); " +
					"no gang of up to 2 Macs: the 2 eligible Macs have 64.3GiB free together after their agents' own 128MiB, a gang of 2 needs 64.5GiB"}},
		},
		{
			name:    "a single eligible Mac",
			nodes:   []Node{mac("a", 40, 0), labeled(mac("b", 40, 0), "pool", "x")},
			pending: []Replica{selecting(big("r", 4), "pool", "x")},
			unplaceable: map[string]Reason{"ns/r": {Code: ReasonNodeSelectorMismatch,
				Message: "0/2 Macs fit: 1 node selector mismatch, 1 insufficient memory (need 64.0GiB, largest free 40.0GiB); " +
					"no gang of up to 4 Macs: only 1 eligible Mac (40.0GiB free), a gang needs 2"}},
		},
		{
			name: "shards count for maxReplicasPerNode",
			// The first gang takes a and b; the second may not use them again.
			nodes:   []Node{mac("a", 80, 0), mac("b", 80, 0), mac("c", 30, 0)},
			pending: []Replica{big("r1", 4), big("r2", 4)},
			// r1 fits a alone (tightest of two equals: a); r2 fits b alone.
			want: bindings("r1", "a", "r2", "b"),
		},
		{
			name:    "maxReplicasPerNode keeps a gang off Macs running the deployment",
			nodes:   []Node{running(mac("a", 40, 0), "ns/big", 1), mac("b", 33, 0), mac("c", 33, 0)},
			pending: []Replica{big("r", 4)},
			want: []Binding{{Replica: "ns/r", Node: "b", Shards: []Shard{
				shard("b", 0, 28, 4+29), shard("c", 29, 59, 0.5+31),
			}}},
		},
		{
			name: "a gang's memory counts on each of its Macs",
			// The gang takes most of a and b; the 10 GiB replica then only fits c.
			nodes:   []Node{mac("a", 40, 0), mac("b", 32, 0), mac("c", 12, 0)},
			pending: []Replica{big("r", 4), resident("s", "other", 10)},
			want: []Binding{{Replica: "ns/r", Node: "a", Shards: []Shard{
				shard("a", 0, 31, 4+32), shard("b", 32, 59, 0.5+28),
			}}, {Replica: "ns/s", Node: "c"}},
		},
		{
			name:    "the quota holds the gang's total",
			nodes:   []Node{mac("a", 40, 0), mac("b", 32, 0)},
			pending: []Replica{big("r", 4)},
			quotas:  map[string]Quota{"ns": {Name: "q", Limit: gb(64.2)}},
			unplaceable: map[string]Reason{"ns/r": {Code: ReasonQuotaExceeded,
				Message: "namespace ns is out of fleet memory quota: the replica needs 64.5GiB, FleetQuota q allows 64.1GiB and 0.0GiB is in use; " +
					"raise the FleetQuota's spec.memory or scale down a deployment in ns"}},
		},
		{
			name:    "Spread orders gangs by the deployment's replicas, then free memory",
			nodes:   []Node{mac("a", 40, 0), running(mac("b", 40, 0), "ns/big", 1), mac("c", 35, 0)},
			pending: []Replica{spread(maxPerNode(big("r", 4), 2))},
			want: []Binding{{Replica: "ns/r", Node: "a", Shards: []Shard{
				shard("a", 0, 30, 4+31), shard("c", 31, 59, 0.5+29),
			}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Solve(Snapshot{Nodes: tc.nodes, Pending: tc.pending, Quotas: tc.quotas}, Options{})
			if diff := cmp.Diff(tc.want, got.Bindings, equateEmpty); diff != "" {
				t.Errorf("bindings (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.unplaceable, got.Unplaceable, equateEmpty); diff != "" {
				t.Errorf("unplaceable (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSolveGangInvariants solves random fleets with gangs and checks what every solve
// must hold: each gang on distinct nodes within MaxNodes, its layers contiguous and
// each placed once, no node over its allocatable memory (its agent's own memory
// included), and no gang with fewer nodes
// possible when it was placed.
func TestSolveGangInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 1))
	for round := range 300 {
		var nodes []Node
		for i := range 2 + rng.IntN(12) {
			n := mac("m"+strconv.Itoa(i), float64(8+rng.IntN(120)), float64(rng.IntN(8)))
			n.LinkBandwidth = int64(rng.IntN(3)) * 10e9
			n.Agent = []int64{0, 64 << 20, 512 << 20}[rng.IntN(3)]
			if rng.IntN(10) == 0 {
				n.Ready = false
			}
			nodes = append(nodes, n)
		}
		var pending []Replica
		for j := range 1 + rng.IntN(6) {
			layers := int32(8 + rng.IntN(120))
			r := splitReplica("r"+strconv.Itoa(j), "d"+strconv.Itoa(rng.IntN(3)), 1+rng.IntN(6), layers,
				0.25+rng.Float64()*2, 1+rng.Float64()*8, rng.Float64())
			r.MaxPerNode = 1 + rng.IntN(2)
			pending = append(pending, r)
		}
		snap := Snapshot{Nodes: nodes, Pending: pending}
		res := Solve(snap, Options{})

		free := map[string]int64{}
		ready := map[string]bool{}
		for _, n := range nodes {
			free[n.Name] = n.Ceiling - n.Committed - n.Agent // what the agent admits
			ready[n.Name] = n.Ready
		}
		byKey := map[string]Replica{}
		for _, r := range pending {
			byKey[r.Key] = r
		}
		for _, b := range res.Bindings {
			r := byKey[b.Replica]
			if b.Shards == nil {
				free[b.Node] -= r.Memory
				continue
			}
			if len(b.Shards) < 2 || len(b.Shards) > r.MaxNodes || b.Shards[0].Node != b.Node {
				t.Fatalf("round %d: %s: %d shards (max %d), head %s, node %s", round, b.Replica, len(b.Shards), r.MaxNodes, b.Shards[0].Node, b.Node)
			}
			// Fewest nodes: the len-1 nodes with the most free memory, before this
			// gang, could not hold it.
			var frees []int64
			for name, f := range free {
				if ready[name] {
					frees = append(frees, f)
				}
			}
			slices.Sort(frees)
			slices.Reverse(frees)
			if k := len(b.Shards) - 1; k >= 2 && holds(r.Layers, frees[:k]) {
				t.Fatalf("round %d: %s on %d nodes, %d would hold it", round, b.Replica, k+1, k)
			}
			next := int32(0)
			seen := map[string]bool{}
			for k, s := range b.Shards {
				over := r.Layers.Worker
				if k == 0 {
					over = r.Layers.Head
				}
				if seen[s.Node] || !ready[s.Node] || s.FirstLayer != next || s.LastLayer < s.FirstLayer ||
					s.Memory != over+int64(s.LastLayer-s.FirstLayer+1)*r.Layers.PerLayer {
					t.Fatalf("round %d: %s: bad shard %d %+v", round, b.Replica, k, s)
				}
				seen[s.Node], next = true, s.LastLayer+1
				free[s.Node] -= s.Memory
			}
			if next != r.Layers.Layers {
				t.Fatalf("round %d: %s: shards cover layers 0..%d of %d", round, b.Replica, next-1, r.Layers.Layers)
			}
		}
		for name, f := range free {
			if f < 0 && ready[name] {
				t.Fatalf("round %d: node %s over-committed by %d bytes", round, name, -f)
			}
		}
		if len(res.Bindings)+len(res.Unplaceable) != len(pending) {
			t.Fatalf("round %d: %d bound + %d unplaceable of %d", round, len(res.Bindings), len(res.Unplaceable), len(pending))
		}
	}
}

// holds is an independent statement of "these free amounts hold the layers", the
// largest as head: whole layers per node.
func holds(m LayerModel, frees []int64) bool {
	var room int64
	for k, f := range frees {
		over := m.Worker
		if k == 0 {
			over = m.Head
		}
		if f-over >= m.PerLayer {
			room += (f - over) / m.PerLayer
		} else if k == 0 {
			return false
		}
	}
	return room >= int64(m.Layers)
}

func TestExplainGang(t *testing.T) {
	snap := Snapshot{Nodes: []Node{mac("a", 40, 0), mac("b", 32, 2), mac("c", 20, 0)}}
	got := Explain(snap, splitReplica("r", "big", 4, 60, 1, 4, 0.5))
	want := Reason{Code: ReasonSchedulable,
		Message: "0/3 Macs fit: 3 insufficient memory (need 64.0GiB, largest free 40.0GiB); a gang of 2 Macs fits"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Explain (-want +got):\n%s", diff)
	}
}

package scheduler

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Gang placement: a replica that fits no single node and may span several
// (Replica.MaxNodes > 1) is split by layers over 2..MaxNodes distinct nodes, all of
// which are bound at once, in one Binding, or none.
//
//   - The eligible nodes are those every filter but memory passes (ready, not
//     cordoned, matching the selector, under maxReplicasPerNode: a shard counts as a
//     replica of the deployment on its node) with room for at least one layer.
//   - The gang has the fewest nodes that can hold every layer: k nodes can when the
//     k with the most allocatable memory can, the largest of them as head.
//   - Among the sets of k nodes that can, the solver prefers the nodes with the
//     fastest link (Node.LinkBandwidth), then the strategy's order (BinPack: least
//     allocatable; Spread: fewest replicas of the deployment, then most allocatable),
//     then the name: it takes nodes in that order, skipping one only when the nodes
//     after it could not complete a gang with it.
//   - Shard 0 (the head) is the chosen node with the most allocatable memory; it pays
//     LayerModel.Head, the others LayerModel.Worker, on top of their layers. The
//     layers are split into contiguous ranges, each shard at least one, the rest in
//     proportion to how many layers each node has room for.

// LayerModel is how a replica's memory divides over its model's layers. The zero
// value means the replica cannot be split.
type LayerModel struct {
	// Layers is the number of transformer blocks.
	Layers int32
	// PerLayer is one block's memory (weights and KV cache), in bytes.
	PerLayer int64
	// Head is what shard 0 reserves besides its blocks; Worker what every other shard
	// does, in bytes.
	Head, Worker int64
}

// splittable reports whether the model describes layers the solver can split.
func (m LayerModel) splittable() bool {
	return m.Layers >= 2 && m.PerLayer > 0 && m.Head >= 0 && m.Worker >= 0
}

// gangNeed is what a gang of k shards reserves in total.
func (m LayerModel) gangNeed(k int) int64 {
	return m.Head + int64(k-1)*m.Worker + int64(m.Layers)*m.PerLayer
}

// Shard is one node's part of a gang Binding. The layer range is inclusive.
type Shard struct {
	Node       string
	FirstLayer int32
	LastLayer  int32
	// Memory is what the shard reserves on its node, in bytes.
	Memory int64
}

// gang is a gang the solver chose: node indexes (head first), their layer counts and
// reservations.
type gang struct {
	nodes  []int32
	layers []int32
	memory []int64
}

// total is the memory the gang reserves over all its nodes.
func (gg *gang) total() int64 {
	var t int64
	for _, m := range gg.memory {
		t += m
	}
	return t
}

// shards renders the gang for a Binding.
func (s *solver) shards(gg *gang) []Shard {
	out := make([]Shard, len(gg.nodes))
	first := int32(0)
	for k, i := range gg.nodes {
		out[k] = Shard{Node: s.nodes[i].Name, FirstLayer: first, LastLayer: first + gg.layers[k] - 1, Memory: gg.memory[k]}
		first += gg.layers[k]
	}
	return out
}

// layerRoom is how many layers node i has room for as head or as worker.
func (s *solver) layerRoom(m LayerModel, i int32, head bool) int64 {
	over := m.Worker
	if head {
		over = m.Head
	}
	left := s.alloc[i] - over
	if left < m.PerLayer {
		return 0
	}
	return left / m.PerLayer
}

// gangCandidates are the nodes of group g every filter but memory passes that have
// room for a layer.
func (s *solver) gangCandidates(g *group) []int32 {
	var eligible []int32
	for _, i := range g.set.nodes {
		if s.underMax(g, i) && s.layerRoom(g.layers, i, false) > 0 {
			eligible = append(eligible, i)
		}
	}
	return eligible
}

// canHold reports whether nodes (any order) hold every layer with the one with the
// most allocatable memory as head.
func (s *solver) canHold(m LayerModel, nodes []int32) bool {
	if len(nodes) == 0 {
		return false
	}
	head := s.headOf(nodes)
	room := s.layerRoom(m, head, true)
	if room == 0 {
		return false
	}
	for _, i := range nodes {
		if i != head {
			room += s.layerRoom(m, i, false)
		}
	}
	return room >= int64(m.Layers)
}

// headOf is the node of nodes with the most allocatable memory, the first of equals.
func (s *solver) headOf(nodes []int32) int32 {
	return slices.MaxFunc(nodes, func(a, b int32) int { return cmp.Compare(s.alloc[a], s.alloc[b]) })
}

// placeGang chooses a gang for a replica of group g, or returns nil.
func (s *solver) placeGang(g *group) *gang {
	// The eligible nodes with the most allocatable memory, walking byAlloc down.
	top := make([]int32, 0, g.maxNodes)
	for k := len(s.byAlloc) - 1; k >= 0 && len(top) < g.maxNodes; k-- {
		if i := s.byAlloc[k]; g.set.has(i) && s.underMax(g, i) && s.layerRoom(g.layers, i, false) > 0 {
			top = append(top, i)
		}
	}
	k := 0
	for n := 2; n <= len(top); n++ {
		if s.canHold(g.layers, top[:n]) {
			k = n
			break
		}
	}
	if k == 0 {
		return nil
	}
	pref := s.gangCandidates(g)
	slices.SortFunc(pref, func(a, b int32) int { return s.comparePreference(g, a, b) })
	chosen := s.chooseGang(g.layers, pref, k)
	return s.splitLayers(g.layers, chosen)
}

// comparePreference orders gang nodes: fastest link, then the strategy's order, then
// name.
func (s *solver) comparePreference(g *group, a, b int32) int {
	if c := cmp.Compare(s.nodes[b].LinkBandwidth, s.nodes[a].LinkBandwidth); c != 0 {
		return c
	}
	if g.strategy == Spread {
		if c := cmp.Compare(g.dep.count(a), g.dep.count(b)); c != 0 {
			return c
		}
		if c := cmp.Compare(s.alloc[b], s.alloc[a]); c != 0 {
			return c
		}
	} else if c := cmp.Compare(s.alloc[a], s.alloc[b]); c != 0 {
		return c
	}
	return cmp.Compare(a, b)
}

// chooseGang takes k nodes from pref, in its order, skipping a node only when the
// nodes after it could not complete a gang that can hold the layers. The k nodes with
// the most allocatable memory can, so it always finds k.
func (s *solver) chooseGang(m LayerModel, pref []int32, k int) []int32 {
	// best[p] is the (up to k) nodes of pref[p:] with the most allocatable memory.
	best := make([][]int32, len(pref)+1)
	for p := len(pref) - 1; p >= 0; p-- {
		next := append(slices.Clone(best[p+1]), pref[p])
		slices.SortFunc(next, func(a, b int32) int { return s.compareAlloc(b, a) })
		best[p] = next[:min(len(next), k)]
	}
	chosen := make([]int32, 0, k)
	try := make([]int32, 0, k)
	for p, i := range pref {
		if len(chosen) == k {
			break
		}
		try = append(append(try[:0], chosen...), i)
		fill := best[p+1][:min(len(best[p+1]), k-len(try))]
		if len(try)+len(fill) == k && s.canHold(m, append(try, fill...)) {
			chosen = append(chosen, i)
		}
	}
	return chosen
}

// splitLayers orders the chosen nodes head first (the most allocatable memory, the
// rest in preference order) and gives each at least one layer, the others in
// proportion to the room left, largest remainders first.
func (s *solver) splitLayers(m LayerModel, chosen []int32) *gang {
	head := slices.Index(chosen, s.headOf(chosen))
	nodes := append([]int32{chosen[head]}, slices.Delete(slices.Clone(chosen), head, head+1)...)
	room := make([]int64, len(nodes))
	var spare int64
	for k, i := range nodes {
		room[k] = s.layerRoom(m, i, k == 0) - 1
		spare += room[k]
	}
	gg := &gang{nodes: nodes, layers: make([]int32, len(nodes)), memory: make([]int64, len(nodes))}
	rest := int64(m.Layers) - int64(len(nodes))
	given := int64(0)
	frac := make([]int64, len(nodes))
	for k := range nodes {
		if spare == 0 {
			break // every node holds exactly one layer
		}
		share := rest * room[k] / spare
		gg.layers[k] = int32(1 + share)
		given += share
		frac[k] = rest*room[k] - share*spare
	}
	order := make([]int, len(nodes))
	for k := range order {
		order[k] = k
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(frac[b], frac[a]) })
	for left := rest - given; left > 0; {
		for _, k := range order {
			if left > 0 && int64(gg.layers[k]) <= room[k] {
				gg.layers[k]++
				left--
			}
		}
	}
	for k := range nodes {
		over := m.Worker
		if k == 0 {
			over = m.Head
		}
		gg.memory[k] = over + int64(gg.layers[k])*m.PerLayer
	}
	return gg
}

// gangReason is the part of an unplaceable replica's message that says why no gang
// fits, appended to the node filters' part. The eligible Macs are those every filter
// but memory passes.
func (s *solver) gangReason(g *group) string {
	var passing []int32
	for _, i := range g.set.nodes {
		if s.underMax(g, i) {
			passing = append(passing, i)
		}
	}
	slices.SortFunc(passing, func(a, b int32) int { return s.compareAlloc(b, a) })
	k := min(g.maxNodes, len(passing))
	var free, agents int64
	for _, i := range passing[:k] {
		free += max(s.alloc[i], 0)
		agents += max(s.nodes[i].Agent, 0)
	}
	m := g.layers
	need := m.gangNeed(max(k, 2))
	var sb strings.Builder
	fmt.Fprintf(&sb, "no gang of up to %d Macs: ", g.maxNodes)
	switch {
	case len(passing) == 0:
		sb.WriteString("no eligible Macs")
	case len(passing) == 1:
		fmt.Fprintf(&sb, "only 1 eligible Mac (%s free%s), a gang needs 2", gib(free, math.Floor), agentNote(agents, "its agent's"))
	case k < len(passing):
		fmt.Fprintf(&sb, "the %d eligible Macs with the most free memory (of %d) have %s free together%s, a gang of %d needs %s",
			k, len(passing), gib(free, math.Floor), agentNote(agents, "their agents'"), k, gib(need, math.Ceil))
	default:
		fmt.Fprintf(&sb, "the %d eligible Macs have %s free together%s, a gang of %d needs %s",
			k, gib(free, math.Floor), agentNote(agents, "their agents'"), k, gib(need, math.Ceil))
	}
	if len(passing) > 1 && free >= need {
		fmt.Fprintf(&sb, " in whole layers of %s", gib(m.PerLayer, math.Ceil))
	}
	return sb.String()
}

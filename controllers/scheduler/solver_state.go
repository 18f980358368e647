package scheduler

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
)

// The solver's working state: node indexes, per-deployment counts, the groups of
// replicas that share a node filter, and the walks that pick a node for each.

// solver is the mutable state of one solve. Nodes are indexed in name order, so that
// scanning a node list in index order and keeping the first best candidate breaks ties
// by name.
type solver struct {
	tuning
	nodes []*Node
	// alloc is each node's allocatable memory (ceiling minus committed minus its
	// agent's own), updated as reserving replicas are bound; ceiling is each node's
	// ceiling minus its agent's own.
	alloc, ceiling []int64
	// notReady and cordoned count the nodes the first two filters reject.
	notReady, cordoned int
	// schedulable is the set of ready, uncordoned nodes.
	schedulable *nodeSet
	// byAlloc lists the schedulable nodes ordered by (allocatable, index); pos[i] is
	// node i's position in it.
	byAlloc, pos []int32
	// sets caches the schedulable nodes matching a node selector, by canonical selector.
	sets map[string]*nodeSet
	deps map[string]*deployment
	// bound counts the bindings made so far.
	bound int
}

// nodeSet is a set of schedulable nodes, as a list in index order and as a bitset.
type nodeSet struct {
	nodes []int32
	// member is nil for the set of all schedulable nodes.
	member []uint64
}

func (ns *nodeSet) has(i int32) bool {
	return ns.member == nil || ns.member[i>>6]&(1<<(uint32(i)&63)) != 0
}

// deployment tracks how many replicas of one deployment each node runs. Most nodes run
// none, so counts is sparse and the bitset answers "none" without a map lookup.
type deployment struct {
	some   []uint64
	counts map[int32]int32
	groups []*group
}

func (d *deployment) count(i int32) int32 {
	if d.some[i>>6]&(1<<(uint32(i)&63)) == 0 {
		return 0
	}
	return d.counts[i]
}

func (d *deployment) add(i int32) {
	if d.counts == nil {
		d.counts = make(map[int32]int32)
	}
	d.counts[i]++
	d.some[i>>6] |= 1 << (uint32(i) & 63)
}

// group is the replicas of a deployment that share every placement input but memory.
type group struct {
	dep        *deployment
	selector   map[string]string
	strategy   Strategy
	maxPerNode int32
	reserves   bool
	// maxNodes and layers are the replicas' MaxNodes (at least 1) and Layers.
	maxNodes int
	layers   LayerModel
	// set is the schedulable nodes matching the selector.
	set *nodeSet
	// gangFailed: a replica of the group found no gang.
	gangFailed bool

	failed           bool
	failedMemory     int64
	lastReason       Reason
	lastReasonAt     int
	lastReasonMemory int64
}

func newSolver(nodes []Node, pending []Replica, tun tuning) *solver {
	s := &solver{
		tuning:  tun,
		nodes:   make([]*Node, len(nodes)),
		alloc:   make([]int64, len(nodes)),
		ceiling: make([]int64, len(nodes)),
		pos:     make([]int32, len(nodes)),
		sets:    make(map[string]*nodeSet),
		deps:    make(map[string]*deployment),
	}
	for i := range nodes {
		s.nodes[i] = &nodes[i]
	}
	slices.SortStableFunc(s.nodes, func(a, b *Node) int { return strings.Compare(a.Name, b.Name) })

	s.schedulable = &nodeSet{nodes: make([]int32, 0, len(nodes))}
	for i, n := range s.nodes {
		agent := max(n.Agent, 0)
		s.alloc[i] = n.Ceiling - n.Committed - agent
		s.ceiling[i] = n.Ceiling - agent
		switch {
		case !n.Ready:
			s.notReady++
		case n.Unschedulable:
			s.cordoned++
		default:
			s.schedulable.nodes = append(s.schedulable.nodes, int32(i))
		}
	}
	s.byAlloc = slices.Clone(s.schedulable.nodes)
	slices.SortFunc(s.byAlloc, s.compareAlloc)
	for k, i := range s.byAlloc {
		s.pos[i] = int32(k)
	}

	// Per-deployment counts, only for deployments with pending replicas. The bitsets
	// share one allocation.
	words := (len(nodes) + 63) / 64
	for i := range pending {
		if _, ok := s.deps[pending[i].Deployment]; !ok {
			s.deps[pending[i].Deployment] = nil
		}
	}
	slab := make([]uint64, words*len(s.deps))
	ds := make([]deployment, len(s.deps))
	k := 0
	for key := range s.deps {
		ds[k].some = slab[k*words : (k+1)*words : (k+1)*words]
		s.deps[key] = &ds[k]
		k++
	}
	for i, n := range s.nodes {
		for key, c := range n.ReplicasByDeployment {
			if d := s.deps[key]; d != nil && c > 0 {
				if d.counts == nil {
					d.counts = make(map[int32]int32)
				}
				d.counts[int32(i)] = int32(min(c, math.MaxInt32))
				d.some[i>>6] |= 1 << (uint(i) & 63)
			}
		}
	}
	return s
}

// compareAlloc orders nodes by allocatable memory, then index (name).
func (s *solver) compareAlloc(a, b int32) int {
	if c := cmp.Compare(s.alloc[a], s.alloc[b]); c != 0 {
		return c
	}
	return cmp.Compare(a, b)
}

// groupFor returns the group of replica r, creating it on first use.
func (s *solver) groupFor(r *Replica) *group {
	d := s.deps[r.Deployment]
	strategy := r.Strategy
	if strategy != Spread {
		strategy = BinPack
	}
	maxPerNode := int32(min(max(r.MaxPerNode, 1), math.MaxInt32))
	maxNodes := max(r.MaxNodes, 1)
	for _, g := range d.groups {
		if g.strategy == strategy && g.maxPerNode == maxPerNode && g.reserves == r.Reserves &&
			g.maxNodes == maxNodes && g.layers == r.Layers && maps.Equal(g.selector, r.NodeSelector) {
			return g
		}
	}
	g := &group{
		dep:        d,
		selector:   r.NodeSelector,
		strategy:   strategy,
		maxPerNode: maxPerNode,
		reserves:   r.Reserves,
		maxNodes:   maxNodes,
		layers:     r.Layers,
		set:        s.matching(r.NodeSelector),
	}
	d.groups = append(d.groups, g)
	return g
}

// matching returns the schedulable nodes whose labels match the selector.
func (s *solver) matching(selector map[string]string) *nodeSet {
	if len(selector) == 0 {
		return s.schedulable
	}
	keys := slices.Sorted(maps.Keys(selector))
	var sb strings.Builder
	for _, k := range keys {
		sb.WriteString(k)
		sb.WriteByte(0)
		sb.WriteString(selector[k])
		sb.WriteByte(0)
	}
	canon := sb.String()
	if set, ok := s.sets[canon]; ok {
		return set
	}
	set := &nodeSet{member: make([]uint64, (len(s.nodes)+63)/64)}
	for _, i := range s.schedulable.nodes {
		if selectorMatches(selector, s.nodes[i].Labels) {
			set.nodes = append(set.nodes, i)
			set.member[i>>6] |= 1 << (uint32(i) & 63)
		}
	}
	s.sets[canon] = set
	return set
}

func selectorMatches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// fits is the memory filter: a reserving replica must fit the allocatable memory, a
// non-reserving one the ceiling.
func (s *solver) fits(g *group, i int32, mem int64) bool {
	if g.reserves {
		return s.alloc[i] >= mem
	}
	return s.ceiling[i] >= mem
}

// underMax is the maxReplicasPerNode filter.
func (s *solver) underMax(g *group, i int32) bool {
	return g.dep.count(i) < g.maxPerNode
}

// pick returns the best feasible node for a replica of group g needing mem bytes, or
// -1. Small groups scan their own nodes; groups that may use many nodes walk the nodes
// ordered by allocatable memory, which finds the answer in a few steps.
func (s *solver) pick(g *group, mem int64) int32 {
	switch {
	case len(g.set.nodes) < s.walkFrom:
		return s.scan(g, mem)
	case g.strategy == BinPack && g.reserves:
		return s.walkTightest(g, mem)
	case g.strategy == Spread:
		return s.walkSpread(g, mem)
	default:
		return s.scan(g, mem)
	}
}

// scan picks by visiting every node of the group in name order; only a strictly
// better candidate replaces the current best, which breaks ties by name.
func (s *solver) scan(g *group, mem int64) int32 {
	best := int32(-1)
	switch {
	case g.strategy == BinPack && g.reserves:
		// Tightest fit: least allocatable left after placement.
		bestLeft := int64(math.MaxInt64)
		for _, i := range g.set.nodes {
			left := s.alloc[i] - mem
			if left < 0 || left >= bestLeft || !s.underMax(g, i) {
				continue
			}
			best, bestLeft = i, left
			if left == 0 {
				break
			}
		}
	case g.strategy == BinPack:
		// A non-reserving replica leaves allocatable unchanged. Prefer the node where
		// it also fits the free memory most tightly (it can load without pushing
		// anything out); failing that, the node where it overflows the least.
		bestOver, bestKey := true, int64(math.MaxInt64)
		for _, i := range g.set.nodes {
			if !s.fits(g, i, mem) || !s.underMax(g, i) {
				continue
			}
			left := s.alloc[i] - mem
			over, key := left < 0, left
			if over {
				key = -left
			}
			if best < 0 || (bestOver && !over) || (over == bestOver && key < bestKey) {
				best, bestOver, bestKey = i, over, key
			}
		}
	default:
		// Spread: fewest replicas of the deployment, then most allocatable.
		var bestCount int32
		var bestAlloc int64
		for _, i := range g.set.nodes {
			if !s.fits(g, i, mem) {
				continue
			}
			c := g.dep.count(i)
			if c >= g.maxPerNode {
				continue
			}
			if best < 0 || c < bestCount || (c == bestCount && s.alloc[i] > bestAlloc) {
				best, bestCount, bestAlloc = i, c, s.alloc[i]
			}
		}
	}
	return best
}

// walkTightest is BinPack for a reserving replica: the first feasible node at or above
// mem in (allocatable, name) order is the tightest fit, ties to the smallest name.
func (s *solver) walkTightest(g *group, mem int64) int32 {
	start, _ := slices.BinarySearchFunc(s.byAlloc, mem, func(i int32, mem int64) int {
		return cmp.Compare(s.alloc[i], mem)
	})
	for _, i := range s.byAlloc[start:] {
		if g.set.has(i) && s.underMax(g, i) {
			return i
		}
	}
	return -1
}

// walkSpread is Spread: walking down from the most allocatable node, the first feasible
// node without replicas of the deployment wins once its equals in allocatable memory
// (met in descending name order) are seen; a node already running some only wins if
// no such node exists, so then the walk goes on.
func (s *solver) walkSpread(g *group, mem int64) int32 {
	best := int32(-1)
	var bestCount int32
	var bestAlloc int64
	for k := len(s.byAlloc) - 1; k >= 0; k-- {
		i := s.byAlloc[k]
		a := s.alloc[i]
		if (g.reserves && a < mem) || (best >= 0 && bestCount == 0 && a < bestAlloc) {
			break
		}
		if !g.set.has(i) || !s.fits(g, i, mem) {
			continue
		}
		c := g.dep.count(i)
		if c >= g.maxPerNode {
			continue
		}
		if best < 0 || c < bestCount || (c == bestCount && (a > bestAlloc || (a == bestAlloc && i < best))) {
			best, bestCount, bestAlloc = i, c, a
		}
	}
	return best
}

// gang reports whether the group's replicas may be placed as gangs.
func (g *group) gang() bool {
	return g.maxNodes > 1 && g.reserves && g.layers.splittable()
}

// bindGang records a gang of a replica (by key) of group g and returns its Binding.
func (s *solver) bindGang(g *group, key string, gg *gang) Binding {
	for k, i := range gg.nodes {
		s.bind(g, i, gg.memory[k])
	}
	return Binding{Replica: key, Node: s.nodes[gg.nodes[0]].Name, Shards: s.shards(gg)}
}

// bind records a replica of group g on node i.
func (s *solver) bind(g *group, i int32, mem int64) {
	if g.reserves && mem > 0 {
		s.alloc[i] -= mem
		// Move i down byAlloc to its new place, shifting the nodes in between up.
		from := int(s.pos[i])
		to, _ := slices.BinarySearchFunc(s.byAlloc[:from], i, s.compareAlloc)
		copy(s.byAlloc[to+1:from+1], s.byAlloc[to:from])
		s.byAlloc[to] = i
		for k := to; k <= from; k++ {
			s.pos[s.byAlloc[k]] = int32(k)
		}
	}
	g.dep.add(i)
	s.bound++
}

// explain runs every filter over every node for a replica of group g needing mem
// bytes, counting each node under the first filter that rejects it.
func (s *solver) explain(g *group, mem int64) breakdown {
	b := breakdown{
		total:      len(s.nodes),
		maxPerNode: int(g.maxPerNode),
		need:       mem,
		largest:    math.MinInt64,
		reserves:   g.reserves,
	}
	b.rejected[filterNotReady] = s.notReady
	b.rejected[filterCordoned] = s.cordoned
	b.rejected[filterSelector] = len(s.schedulable.nodes) - len(g.set.nodes)
	for _, i := range g.set.nodes {
		switch {
		case !s.underMax(g, i):
			b.rejected[filterMaxPerNode]++
		case !s.fits(g, i, mem):
			b.rejected[filterMemory]++
			offered := s.ceiling[i]
			if g.reserves {
				offered = s.alloc[i]
			}
			b.offer(offered, s.nodes[i].Agent)
		default:
			b.fit++
		}
	}
	return b
}

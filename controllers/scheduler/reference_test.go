package scheduler

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
)

// referenceSolve is the solver's specification written as plainly as possible: maps
// instead of indexes, every filter evaluated for every (replica, node) pair, no
// grouping, no caches. Solve must return exactly what it returns; the benchmark also
// measures it as a baseline.
func referenceSolve(snap Snapshot) Result {
	nodes := slices.Clone(snap.Nodes)
	slices.SortStableFunc(nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	pending := slices.Clone(snap.Pending)
	slices.SortStableFunc(pending, func(a, b Replica) int {
		if c := cmp.Compare(max(b.Memory, 0), max(a.Memory, 0)); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})

	alloc := map[string]int64{}
	counts := map[string]map[string]int{} // deployment -> node -> replicas
	for _, n := range nodes {
		alloc[n.Name] = n.Ceiling - n.Committed - n.Agent
		for d, c := range n.ReplicasByDeployment {
			if counts[d] == nil {
				counts[d] = map[string]int{}
			}
			counts[d][n.Name] += c
		}
	}

	res := Result{Unplaceable: map[string]Reason{}}
	for _, r := range pending {
		mem := max(r.Memory, 0)
		maxPerNode := max(r.MaxPerNode, 1)
		b := breakdown{total: len(nodes), maxPerNode: maxPerNode, need: mem, largest: math.MinInt64, reserves: r.Reserves}
		best := -1
		for i, n := range nodes {
			f, ok := referenceFilter(n, r, alloc[n.Name], counts[r.Deployment][n.Name])
			if !ok {
				b.rejected[f]++
				if f == filterMemory {
					offered := n.Ceiling - n.Agent
					if r.Reserves {
						offered = alloc[n.Name]
					}
					b.offer(offered, n.Agent)
				}
				continue
			}
			b.fit++
			if best < 0 || referenceBetter(r, n, nodes[best], alloc, counts[r.Deployment]) {
				best = i
			}
		}
		if best < 0 {
			res.Unplaceable[r.Key] = b.reason()
			continue
		}
		name := nodes[best].Name
		if r.Reserves {
			alloc[name] -= mem
		}
		if counts[r.Deployment] == nil {
			counts[r.Deployment] = map[string]int{}
		}
		counts[r.Deployment][name]++
		res.Bindings = append(res.Bindings, Binding{Replica: r.Key, Node: name})
	}
	return res
}

// referenceFilter returns the first filter rejecting node n for replica r, or ok.
func referenceFilter(n Node, r Replica, alloc int64, count int) (filter, bool) {
	switch {
	case !n.Ready:
		return filterNotReady, false
	case n.Unschedulable:
		return filterCordoned, false
	}
	for k, v := range r.NodeSelector {
		if got, ok := n.Labels[k]; !ok || got != v {
			return filterSelector, false
		}
	}
	if count >= max(r.MaxPerNode, 1) {
		return filterMaxPerNode, false
	}
	mem := max(r.Memory, 0)
	if (r.Reserves && alloc < mem) || (!r.Reserves && n.Ceiling-n.Agent < mem) {
		return filterMemory, false
	}
	return 0, true
}

// referenceBetter says whether feasible node a scores strictly better than feasible
// node b for replica r.
func referenceBetter(r Replica, a, b Node, alloc map[string]int64, counts map[string]int) bool {
	mem := max(r.Memory, 0)
	if r.Strategy == Spread {
		if counts[a.Name] != counts[b.Name] {
			return counts[a.Name] < counts[b.Name]
		}
		return alloc[a.Name] > alloc[b.Name]
	}
	la, lb := alloc[a.Name]-mem, alloc[b.Name]-mem
	if r.Reserves {
		return la < lb
	}
	// Non-reserving: fitting the free memory beats overflowing it; then tightest fit,
	// or least overflow.
	if (la < 0) != (lb < 0) {
		return la >= 0
	}
	if la >= 0 {
		return la < lb
	}
	return -la < -lb
}

// firstFit is the cheapest placement there is, as a speed baseline: replicas and
// nodes in input order, the first node passing every filter wins, no scores and no
// reasons.
func firstFit(snap Snapshot) Result {
	alloc := make(map[string]int64, len(snap.Nodes))
	for _, n := range snap.Nodes {
		alloc[n.Name] = n.Ceiling - n.Committed - n.Agent
	}
	placed := map[[2]string]int{} // (deployment, node) -> replicas bound by this solve
	res := Result{Unplaceable: map[string]Reason{}}
	for _, r := range snap.Pending {
		bound := false
		for _, n := range snap.Nodes {
			c := n.ReplicasByDeployment[r.Deployment] + placed[[2]string{r.Deployment, n.Name}]
			if _, ok := referenceFilter(n, r, alloc[n.Name], c); !ok {
				continue
			}
			if r.Reserves {
				alloc[n.Name] -= r.Memory
			}
			placed[[2]string{r.Deployment, n.Name}]++
			res.Bindings = append(res.Bindings, Binding{Replica: r.Key, Node: n.Name})
			bound = true
			break
		}
		if !bound {
			res.Unplaceable[r.Key] = Reason{Code: "Unschedulable"}
		}
	}
	return res
}

// randomSnapshot draws a snapshot of up to maxNodes nodes and maxPending replicas of
// up to deployments deployments from few distinct values, so ties, exact fits, shared
// selectors and saturated nodes are common.
func randomSnapshot(rng *rand.Rand, maxNodes, maxPending, deployments int) Snapshot {
	var snap Snapshot
	labelValues := []string{"m1", "m2", "m4"}
	for i := range rng.IntN(maxNodes + 1) {
		n := Node{
			Name:          fmt.Sprintf("mac-%02d-%03d", rng.IntN(100), i), // unique, not in index order
			Ready:         rng.IntN(8) != 0,
			Unschedulable: rng.IntN(10) == 0,
			Ceiling:       int64(rng.IntN(6)+1) * 8 * gi,
			Labels:        map[string]string{},
		}
		n.Committed = int64(rng.IntN(5))*4*gi + int64(rng.IntN(2))*gi/2
		// Some agents report their own memory: exact fits by reservations then miss.
		n.Agent = []int64{0, 0, 64 << 20, gi / 2}[rng.IntN(4)]
		if rng.IntN(4) != 0 {
			n.Labels["chip"] = labelValues[rng.IntN(len(labelValues))]
		}
		if rng.IntN(2) == 0 {
			n.Labels["rack"] = labelValues[rng.IntN(2)]
		}
		for d := range deployments {
			if rng.IntN(4*deployments/3+1) == 0 {
				if n.ReplicasByDeployment == nil {
					n.ReplicasByDeployment = map[string]int{}
				}
				n.ReplicasByDeployment[fmt.Sprintf("ns/d%d", d)] = rng.IntN(3) + 1
			}
		}
		snap.Nodes = append(snap.Nodes, n)
	}
	for i := range rng.IntN(maxPending + 1) {
		d := rng.IntN(deployments)
		r := Replica{
			Key:        fmt.Sprintf("ns/r%03d", i),
			Deployment: fmt.Sprintf("ns/d%d", d),
			Memory:     int64(rng.IntN(7))*4*gi + int64(rng.IntN(3)/2)*gi,
			Reserves:   rng.IntN(4) != 0,
			Strategy:   []Strategy{"", BinPack, Spread}[rng.IntN(3)],
			MaxPerNode: rng.IntN(3),
		}
		switch rng.IntN(4) {
		case 0:
			r.NodeSelector = map[string]string{"chip": labelValues[rng.IntN(len(labelValues))]}
		case 1:
			r.NodeSelector = map[string]string{"chip": labelValues[rng.IntN(len(labelValues))], "rack": "m1"}
		}
		snap.Pending = append(snap.Pending, r)
	}
	return snap
}

const gi = int64(1) << 30

// benchSnapshot builds a fleet of nodes Macs and replicas pending replicas in
// deployments of ten, deterministically from seed. strategies are drawn per deployment.
// About 5% of the Macs are not ready, 2% cordoned; a quarter of the deployments select
// a chip, some also a rack; a tenth are OnDemand; a fifth allow 2–4 replicas per Mac;
// some already run replicas. Demand is sized so that most, not all, replicas fit.
func benchSnapshot(nodes, replicas int, strategies []Strategy, seed uint64) Snapshot {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	chips := []string{"m1-max", "m2-ultra", "m3-max", "m4-pro"}
	ceilings := []int64{16, 24, 36, 48, 64, 96, 128, 192}
	snap := Snapshot{Nodes: make([]Node, nodes), Pending: make([]Replica, 0, replicas)}
	for i := range snap.Nodes {
		ceiling := ceilings[rng.IntN(len(ceilings))] * gi * 3 / 4
		snap.Nodes[i] = Node{
			Name: fmt.Sprintf("mac-%04d", i),
			Labels: map[string]string{
				"macfleet.dev/chip": chips[rng.IntN(len(chips))],
				"macfleet.dev/rack": fmt.Sprintf("rack-%02d", rng.IntN(20)),
			},
			Ready:         rng.IntN(20) != 0,
			Unschedulable: rng.IntN(50) == 0,
			Ceiling:       ceiling,
			Committed:     ceiling * int64(rng.IntN(4)) / 8,
		}
	}
	sizes := []int64{1, 1, 2, 2, 2, 3, 4, 4, 5, 6, 8, 12}
	for d := 0; len(snap.Pending) < replicas; d++ {
		dep := fmt.Sprintf("team-%02d/model-%04d", d%37, d)
		r := Replica{
			Deployment: dep,
			Memory:     sizes[rng.IntN(len(sizes))]*gi + int64(rng.IntN(1024))<<20,
			Reserves:   rng.IntN(10) != 0,
			Strategy:   strategies[rng.IntN(len(strategies))],
			MaxPerNode: 1,
		}
		if rng.IntN(5) == 0 {
			r.MaxPerNode = 2 + rng.IntN(3)
		}
		switch rng.IntN(20) {
		case 0, 1, 2, 3:
			r.NodeSelector = map[string]string{"macfleet.dev/chip": chips[rng.IntN(len(chips))]}
		case 4:
			r.NodeSelector = map[string]string{
				"macfleet.dev/chip": chips[rng.IntN(len(chips))],
				"macfleet.dev/rack": fmt.Sprintf("rack-%02d", rng.IntN(20)),
			}
		}
		if rng.IntN(3) == 0 {
			for range 1 + rng.IntN(3) {
				n := &snap.Nodes[rng.IntN(nodes)]
				if n.ReplicasByDeployment == nil {
					n.ReplicasByDeployment = map[string]int{}
				}
				n.ReplicasByDeployment[dep]++
			}
		}
		for k := 0; k < 10 && len(snap.Pending) < replicas; k++ {
			r.Key = fmt.Sprintf("%s-%d", dep, k)
			snap.Pending = append(snap.Pending, r)
		}
	}
	return snap
}

// Package scheduler places ModelReplicas on MacNodes. The decision is a pure function,
// Solve, over a Snapshot of the fleet: it has no client, no clock and no logger, so the
// reconciler that gathers the snapshot and writes the bindings stays thin, and the same
// code answers "what if" questions (Explain) and is benchmarked on its own.
//
// A replica whose namespace has a Quota is first checked against it: if binding it
// would take the namespace's bound replicas over the limit it is unplaceable with
// ReasonQuotaExceeded, whatever the nodes offer; each binding counts towards the
// quota for the replicas after it.
//
// Filters run in a fixed order and a node is counted once, under the first filter that
// rejects it: not ready, cordoned, node selector mismatch, max replicas of the
// deployment per node, insufficient memory. Scores: BinPack (the default) takes the
// feasible node left with the least allocatable memory; Spread takes the node running
// the fewest replicas of the deployment, then the one with the most allocatable memory.
// A non-reserving (OnDemand) replica under BinPack prefers the node where it also fits
// the free memory most tightly, then the node where it overflows the free memory least.
// Ties go to the lexically smallest node name.
//
// A reserving replica that fits no single node and may span several (MaxNodes > 1,
// with a LayerModel) is placed as a gang over distinct nodes, all or none (gang.go).
package scheduler

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// Strategy is how a deployment's replicas are spread over the feasible nodes.
type Strategy string

const (
	// BinPack fills the tightest-fitting node first, keeping whole Macs free for big models.
	BinPack Strategy = "BinPack"
	// Spread puts each replica on the node running the fewest replicas of its deployment.
	Spread Strategy = "Spread"
)

// Node is one Mac as the solver sees it.
type Node struct {
	Name   string
	Labels map[string]string
	// Ready is false while the node's lease is expired or its agent reports not ready.
	Ready bool
	// Unschedulable is the cordon flag (MacNode spec.unschedulable).
	Unschedulable bool
	// Ceiling is the memory the node may give to models, in bytes.
	Ceiling int64
	// Committed is the sum of the reservations of the reserving (Resident or Pinned)
	// replicas already bound to the node, in bytes.
	Committed int64
	// Agent is the memory the node's agent itself uses, in bytes (MacNode
	// status.memory.agent). Its engine pool counts it as in use when it admits a
	// replica's process, so the solver takes it off the node's memory: a reserving
	// replica must fit Ceiling − Committed − Agent, any replica Ceiling − Agent.
	Agent int64
	// ReplicasByDeployment counts the replicas already bound to the node, by deployment
	// key (namespace/name), for maxReplicasPerNode; a shard of a split replica counts
	// as one.
	ReplicasByDeployment map[string]int
	// LinkBandwidth is the node's link speed in bits per second, 0 if unknown; gangs
	// prefer faster links.
	LinkBandwidth int64
}

// Replica is one unbound ModelReplica waiting for a node.
type Replica struct {
	// Key is the replica's namespace/name. Keys are unique within a snapshot.
	Key string
	// Namespace is the replica's namespace, whose Quota (if any) it must fit.
	Namespace string
	// Deployment is the owning deployment's namespace/name.
	Deployment string
	// Memory is the replica's memory reservation in bytes.
	Memory int64
	// Reserves is true for Resident and Pinned replicas: they must fit the node's
	// allocatable memory (ceiling minus committed) and take it. OnDemand replicas
	// reserve nothing and only have to fit the ceiling.
	Reserves bool
	// NodeSelector must match the node's labels exactly (every key present, same value).
	NodeSelector map[string]string
	// Strategy defaults to BinPack.
	Strategy Strategy
	// MaxPerNode caps the replicas of the deployment on one node; 0 means 1.
	MaxPerNode int
	// MaxNodes is how many nodes the replica may span; 0 and 1 mean one. Above 1, a
	// reserving replica with a splittable Layers that fits no single node is placed
	// as a gang.
	MaxNodes int
	// Layers is how the replica's memory divides over its layers, for a gang.
	Layers LayerModel
}

// Snapshot is the solver's whole input: the fleet, the replicas to place and the
// namespaces' memory quotas. Node names are unique.
type Snapshot struct {
	Nodes   []Node
	Pending []Replica
	// Quotas are the memory quotas by namespace; a namespace without one is limited
	// only by the nodes.
	Quotas map[string]Quota
}

// Quota is a namespace's budget of fleet memory: its bound replicas' reservations,
// reserving or not, may add up to Limit.
type Quota struct {
	// Name names the FleetQuota the limit comes from, for messages.
	Name string
	// Limit is the budget in bytes.
	Limit int64
	// Used is the memory of the namespace's bound replicas, in bytes.
	Used int64
}

// Options tunes a solve. The zero value is the documented behaviour; there is nothing
// to tune yet, the parameter keeps Solve's signature stable when there is.
type Options struct{}

// Binding assigns a replica (by key) to a node (by name). For a gang, Node is the
// head's node and Shards lists every shard, head first; Shards is nil otherwise.
type Binding struct {
	Replica string
	Node    string
	Shards  []Shard
}

// Result is what a solve decided. Bindings are in placement order (largest memory
// first, then by replica key); every pending replica is either bound or in Unplaceable.
type Result struct {
	Bindings    []Binding
	Unplaceable map[string]Reason
}

// ReasonCode is a machine-readable reason, usable as a condition reason. For an
// unplaceable replica it names the filter that rejected the most nodes (on a tie, the
// filter evaluated first).
type ReasonCode string

const (
	// ReasonSchedulable is returned by Explain when at least one node fits.
	ReasonSchedulable ReasonCode = "Schedulable"
	// ReasonNoNodes means the snapshot has no nodes at all.
	ReasonNoNodes ReasonCode = "NoNodes"
	// ReasonNodeNotReady: nodes not Ready.
	ReasonNodeNotReady ReasonCode = "NodeNotReady"
	// ReasonNodeCordoned: nodes marked unschedulable.
	ReasonNodeCordoned ReasonCode = "NodeCordoned"
	// ReasonNodeSelectorMismatch: nodes whose labels do not match the node selector.
	ReasonNodeSelectorMismatch ReasonCode = "NodeSelectorMismatch"
	// ReasonMaxReplicasPerNode: nodes already running maxReplicasPerNode replicas of
	// the deployment.
	ReasonMaxReplicasPerNode ReasonCode = "MaxReplicasPerNode"
	// ReasonInsufficientMemory: nodes without the memory.
	ReasonInsufficientMemory ReasonCode = "InsufficientMemory"
	// ReasonQuotaExceeded: binding the replica would take its namespace's bound
	// replicas over the namespace's Quota; no node is considered.
	ReasonQuotaExceeded ReasonCode = "QuotaExceeded"
)

// Reason explains where a replica can or cannot go.
//
// Message is kube-scheduler style, e.g.
// "0/3 Macs fit: 2 insufficient memory (need 9.1GiB, largest free 6.0GiB), 1 not ready":
// every node is counted once, under the first filter that rejected it; the parts are
// ordered by count, largest first, ties in filter order. Code is the first part's code.
type Reason struct {
	Code    ReasonCode
	Message string
}

// filter identifies the filter that rejected a node; the order is the evaluation order.
type filter int

const (
	filterNotReady filter = iota
	filterCordoned
	filterSelector
	filterMaxPerNode
	filterMemory
	numFilters
)

var filterCodes = [numFilters]ReasonCode{
	filterNotReady:   ReasonNodeNotReady,
	filterCordoned:   ReasonNodeCordoned,
	filterSelector:   ReasonNodeSelectorMismatch,
	filterMaxPerNode: ReasonMaxReplicasPerNode,
	filterMemory:     ReasonInsufficientMemory,
}

// breakdown is a replica's verdict over every node: how many fit and, for the rest,
// how many each filter rejected first.
type breakdown struct {
	total    int
	fit      int
	rejected [numFilters]int
	// maxPerNode is the replica's effective maxReplicasPerNode.
	maxPerNode int
	// need is the replica's memory; largest is the most memory offered by a node that
	// the memory filter rejected: allocatable for reserving replicas, ceiling otherwise,
	// both less the node's agent's own memory, largestAgent.
	need, largest, largestAgent int64
	reserves                    bool
}

// offer records the memory offered by a node the memory filter rejected, whose agent
// uses agent bytes itself: the largest offer wins, among equal ones the largest agent's,
// so that the message does not depend on the order nodes are seen in.
func (b *breakdown) offer(offered, agent int64) {
	agent = max(agent, 0)
	if offered > b.largest || (offered == b.largest && agent > b.largestAgent) {
		b.largest, b.largestAgent = offered, agent
	}
}

// reason renders the breakdown.
func (b *breakdown) reason() Reason {
	if b.total == 0 {
		return Reason{Code: ReasonNoNodes, Message: "0/0 Macs fit: no Macs in the fleet"}
	}
	order := make([]filter, 0, numFilters)
	for f := range numFilters {
		if b.rejected[f] > 0 {
			order = append(order, f)
		}
	}
	// Stable: equal counts keep filter order.
	slices.SortStableFunc(order, func(x, y filter) int { return cmp.Compare(b.rejected[y], b.rejected[x]) })

	var sb strings.Builder
	fmt.Fprintf(&sb, "%d/%d Macs fit", b.fit, b.total)
	for i, f := range order {
		if i == 0 {
			sb.WriteString(": ")
		} else {
			sb.WriteString(", ")
		}
		n := b.rejected[f]
		switch f {
		case filterNotReady:
			fmt.Fprintf(&sb, "%d not ready", n)
		case filterCordoned:
			fmt.Fprintf(&sb, "%d cordoned", n)
		case filterSelector:
			fmt.Fprintf(&sb, "%d node selector mismatch", n)
		case filterMaxPerNode:
			fmt.Fprintf(&sb, "%d already run this deployment (max %d per Mac)", n, b.maxPerNode)
		case filterMemory:
			offered := "free"
			if !b.reserves {
				offered = "ceiling"
			}
			fmt.Fprintf(&sb, "%d insufficient memory (need %s, largest %s %s%s)",
				n, gib(b.need, math.Ceil), offered, gib(max(b.largest, 0), math.Floor), agentNote(b.largestAgent, "its agent's"))
		}
	}
	code := ReasonSchedulable
	if b.fit == 0 {
		code = filterCodes[order[0]]
	}
	return Reason{Code: code, Message: sb.String()}
}

// agentNote is the part of a message that says how much of a node's memory its agent
// uses itself (whose says whose: "its agent's", "their agents'"), "" when none.
func agentNote(bytes int64, whose string) string {
	if bytes <= 0 {
		return ""
	}
	return fmt.Sprintf(" after %s own %s", whose, mib(bytes))
}

// mib formats bytes as whole MiB, rounded up.
func mib(bytes int64) string {
	return fmt.Sprintf("%dMiB", (bytes+1<<20-1)>>20)
}

// gib formats bytes as GiB with one decimal, rounded by round (math.Ceil for what a
// replica needs, math.Floor for what a node offers, so a message never reads as if
// the replica fitted).
func gib(bytes int64, round func(float64) float64) string {
	return fmt.Sprintf("%.1fGiB", round(float64(bytes)/(1<<30)*10)/10)
}

// Solve places the snapshot's pending replicas. Replicas are placed one at a time,
// largest memory first (first-fit decreasing packs better), ties by key; each binding
// updates the node's allocatable memory and per-deployment count before the next
// replica is considered. The result depends only on the snapshot's contents, not on
// the order of its slices.
func Solve(snap Snapshot, _ Options) Result {
	return solve(snap, defaultTuning)
}

// tuning holds internal knobs that change how fast Solve is, never what it returns;
// tests set them to force every code path.
type tuning struct {
	// walkFrom is the number of candidate nodes from which a group is searched by
	// walking the nodes ordered by allocatable memory rather than scanning its own
	// node list. Walking finds a tight fit in a few steps when the group may use most
	// nodes; scanning is cheaper for a selective node selector.
	walkFrom int
}

var defaultTuning = tuning{walkFrom: 64}

func solve(snap Snapshot, tun tuning) Result {
	s := newSolver(snap.Nodes, snap.Pending, tun)
	res := Result{
		Bindings:    make([]Binding, 0, len(snap.Pending)),
		Unplaceable: make(map[string]Reason),
	}

	order := make([]int32, len(snap.Pending))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int {
		ra, rb := &snap.Pending[a], &snap.Pending[b]
		if c := cmp.Compare(memoryOf(rb), memoryOf(ra)); c != 0 {
			return c
		}
		return strings.Compare(ra.Key, rb.Key)
	})

	quotas := maps.Clone(snap.Quotas)
	for _, pi := range order {
		r := &snap.Pending[pi]
		mem := memoryOf(r)
		q, limited := quotas[r.Namespace]
		if limited && !q.fits(mem) {
			res.Unplaceable[r.Key] = q.reason(r.Namespace, mem)
			continue
		}
		g := s.groupFor(r)
		// Allocatable only shrinks and counts only grow during a solve, so once a
		// replica of a group failed, any later one of that group at least as large
		// fails too: skip the search.
		node := int32(-1)
		if !g.failed || mem < g.failedMemory {
			node = s.pick(g, mem)
		}
		if node < 0 && g.gang() && !g.gangFailed {
			if gg := s.placeGang(g); gg != nil {
				if total := gg.total(); limited && !q.fits(total) {
					res.Unplaceable[r.Key] = q.reason(r.Namespace, total)
					continue
				}
				res.Bindings = append(res.Bindings, s.bindGang(g, r.Key, gg))
				if limited {
					q.Used += gg.total()
					quotas[r.Namespace] = q
				}
				continue
			}
			// Allocatable only shrinks and counts only grow: no later replica of the
			// group (same layers) finds a gang either.
			g.gangFailed = true
		}
		if node < 0 {
			g.failed, g.failedMemory = true, mem
			// Nothing changed since the same group failed at the same size: the
			// reason is the same too.
			if g.lastReason.Code != "" && g.lastReasonAt == s.bound && g.lastReasonMemory == mem {
				res.Unplaceable[r.Key] = g.lastReason
				continue
			}
			b := s.explain(g, mem)
			g.lastReason, g.lastReasonAt, g.lastReasonMemory = b.reason(), s.bound, mem
			if g.gang() && b.fit == 0 {
				g.lastReason.Message += "; " + s.gangReason(g)
			}
			res.Unplaceable[r.Key] = g.lastReason
			continue
		}
		s.bind(g, node, mem)
		if limited {
			q.Used += mem
			quotas[r.Namespace] = q
		}
		res.Bindings = append(res.Bindings, Binding{Replica: r.Key, Node: s.nodes[node].Name})
	}
	return res
}

// fits reports whether mem more bytes stay within the quota.
func (q Quota) fits(mem int64) bool {
	return q.Used <= q.Limit && mem <= q.Limit-q.Used
}

// reason says why a replica of namespace ns needing mem bytes does not fit the quota,
// and what would let it.
func (q Quota) reason(ns string, mem int64) Reason {
	return Reason{Code: ReasonQuotaExceeded, Message: fmt.Sprintf(
		"namespace %s is out of fleet memory quota: the replica needs %s, FleetQuota %s allows %s and %s is in use; "+
			"raise the FleetQuota's spec.memory or scale down a deployment in %s",
		ns, gib(mem, math.Ceil), q.Name, gib(q.Limit, math.Floor), gib(q.Used, math.Ceil), ns)}
}

// Explain says where replica r could go in the snapshot as it is, ignoring the
// snapshot's pending replicas. Code is ReasonSchedulable when at least one node fits.
// It runs the same checks as Solve: the namespace's quota, then the node filters.
func Explain(snap Snapshot, r Replica) Reason {
	if q, ok := snap.Quotas[r.Namespace]; ok && !q.fits(memoryOf(&r)) {
		return q.reason(r.Namespace, memoryOf(&r))
	}
	s := newSolver(snap.Nodes, []Replica{r}, defaultTuning)
	g := s.groupFor(&r)
	b := s.explain(g, memoryOf(&r))
	reason := b.reason()
	if g.gang() && b.fit == 0 {
		if gg := s.placeGang(g); gg != nil {
			return Reason{Code: ReasonSchedulable, Message: fmt.Sprintf("%s; a gang of %d Macs fits", reason.Message, len(gg.nodes))}
		}
		reason.Message += "; " + s.gangReason(g)
	}
	return reason
}

// memoryOf is the replica's memory; a negative reservation counts as none.
func memoryOf(r *Replica) int64 { return max(r.Memory, 0) }

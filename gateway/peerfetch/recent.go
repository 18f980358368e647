package peerfetch

import (
	"slices"
	"sync"
	"time"
)

// Chain is a conversation routed lately: its prefix digests (shallowest first), the
// cache partition it was asked in and when it was last routed; SentAt, when it was
// last routed to the Mac SentTo was asked of.
type Chain struct {
	Digests   []string
	Partition string
	At        time.Time
	SentAt    time.Time
}

// Recent records, per deployment, the conversations routed to it lately, for the
// warm-ups: at most perDeployment each (the least recently routed makes room), at
// most deployments of them (the one routed to least recently makes room). A
// conversation is known by its deepest digest and partition: a longer one (the next
// turn) is another chain. Beside each it records which Macs it was routed to and
// when (at most nodesPerChain, the least recent making room): a Mac is warmed only
// with the chains it was itself sent (SentTo), never with the other conversations of
// a partition it served once. It is safe for concurrent use.
type Recent struct {
	perDeployment, deployments int

	mu      sync.Mutex
	byModel map[string]*recentSet
}

type chainKey struct{ digest, partition string }

type recentSet struct {
	last   time.Time
	chains map[chainKey]*recentChain
}

// recentChain is a recorded chain and the Macs it was routed to, with when.
type recentChain struct {
	Chain
	sent map[string]time.Time
}

// nodesPerChain bounds the Macs recorded per chain.
const nodesPerChain = 16

// NewRecent is an empty record (DefaultRecentPerDeployment and
// DefaultRecentDeployments where a bound is ≤ 0).
func NewRecent(perDeployment, deployments int) *Recent {
	if perDeployment <= 0 {
		perDeployment = DefaultRecentPerDeployment
	}
	if deployments <= 0 {
		deployments = DefaultRecentDeployments
	}
	return &Recent{perDeployment: perDeployment, deployments: deployments, byModel: map[string]*recentSet{}}
}

// Record notes that a request of partition with prefix digests (shallowest first)
// was routed to model, to a replica on Mac node, at now.
func (r *Recent) Record(model string, digests []string, partition, node string, now time.Time) {
	if len(digests) == 0 {
		return
	}
	k := chainKey{digests[len(digests)-1], partition}
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.byModel[model]
	if set == nil {
		if len(r.byModel) >= r.deployments {
			delete(r.byModel, oldest(r.byModel, func(s *recentSet) time.Time { return s.last }))
		}
		set = &recentSet{chains: map[chainKey]*recentChain{}}
		r.byModel[model] = set
	}
	set.last = now
	c := set.chains[k]
	if c == nil {
		if len(set.chains) >= r.perDeployment {
			delete(set.chains, oldest(set.chains, func(c *recentChain) time.Time { return c.At }))
		}
		c = &recentChain{Chain: Chain{Digests: slices.Clone(digests), Partition: partition}, sent: map[string]time.Time{}}
		set.chains[k] = c
	}
	c.At = now
	if node == "" {
		return
	}
	if _, ok := c.sent[node]; !ok && len(c.sent) >= nodesPerChain {
		delete(c.sent, oldest(c.sent, func(t time.Time) time.Time { return t }))
	}
	c.sent[node] = now
}

// Chains are model's recorded conversations (copies), in no particular order.
func (r *Recent) Chains(model string) []Chain {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.byModel[model]
	if set == nil {
		return nil
	}
	out := make([]Chain, 0, len(set.chains))
	for _, c := range set.chains {
		out = append(out, c.Chain)
	}
	return out
}

// SentTo are model's recorded conversations (copies) that were routed to Mac node,
// each with SentAt when last, in no particular order.
func (r *Recent) SentTo(model, node string) []Chain {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.byModel[model]
	if set == nil || node == "" {
		return nil
	}
	var out []Chain
	for _, c := range set.chains {
		if at, ok := c.sent[node]; ok {
			ch := c.Chain
			ch.SentAt = at
			out = append(out, ch)
		}
	}
	return out
}

// oldest is the key of m whose at is the earliest.
func oldest[K comparable, V any](m map[K]V, at func(V) time.Time) K {
	var k K
	var t time.Time
	first := true
	for kk, v := range m {
		if a := at(v); first || a.Before(t) {
			k, t, first = kk, a, false
		}
	}
	return k
}

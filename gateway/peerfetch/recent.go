package peerfetch

import (
	"slices"
	"sync"
	"time"
)

// Chain is a conversation routed lately: its prefix digests (shallowest first), the
// cache partition it was asked in and when it was last routed.
type Chain struct {
	Digests   []string
	Partition string
	At        time.Time
}

// Recent records, per deployment, the conversations routed to it lately, for the
// warm-ups: at most perDeployment each (the least recently routed makes room), at
// most deployments of them (the one routed to least recently makes room). A
// conversation is known by its deepest digest and partition. Beside them it records
// which Macs each partition was routed to and when (ServedAt; at most
// servedPerDeployment pairs a deployment, the least recent making room): a Mac is
// warmed only with the partitions it served. It is safe for concurrent use.
type Recent struct {
	perDeployment, deployments int

	mu      sync.Mutex
	byModel map[string]*recentSet
}

type chainKey struct{ digest, partition string }

type servedKey struct{ partition, node string }

type recentSet struct {
	last   time.Time
	chains map[chainKey]*Chain
	served map[servedKey]time.Time
}

// servedPerDeployment bounds the (partition, Mac) pairs recorded per deployment.
const servedPerDeployment = 256

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
		set = &recentSet{chains: map[chainKey]*Chain{}, served: map[servedKey]time.Time{}}
		r.byModel[model] = set
	}
	set.last = now
	if node != "" {
		sk := servedKey{partition, node}
		if _, ok := set.served[sk]; !ok && len(set.served) >= servedPerDeployment {
			delete(set.served, oldest(set.served, func(t time.Time) time.Time { return t }))
		}
		set.served[sk] = now
	}
	if c := set.chains[k]; c != nil {
		c.At = now
		return
	}
	if len(set.chains) >= r.perDeployment {
		delete(set.chains, oldest(set.chains, func(c *Chain) time.Time { return c.At }))
	}
	set.chains[k] = &Chain{Digests: slices.Clone(digests), Partition: partition, At: now}
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
		out = append(out, *c)
	}
	return out
}

// ServedAt is when a request of partition was last routed to model on Mac node (zero:
// never, as far as this record goes).
func (r *Recent) ServedAt(model, partition, node string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if set := r.byModel[model]; set != nil {
		return set.served[servedKey{partition, node}]
	}
	return time.Time{}
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

package routing

import (
	"math"

	"github.com/macfleet/macfleet/gateway/prefixindex"
)

// How a request's replica was picked, as the routing decisions metric and the
// request's span name it.
const (
	RoutedPrefixHit      = "prefix_hit"
	RoutedPrefixInFlight = "prefix_inflight"
	RoutedFallback       = "fallback"
	RoutedPrefixAffinity = "prefix_affinity"
	RoutedLeastLoad      = "least_load"
)

// Hint is what of a request picks its replica: the mode, under PrefixAffinity the
// hash of its prefix (H), under PrefixCache its prefix digests and, when it has a
// prompt_cache_key (Keyed), the key's hash.
type Hint struct {
	Mode    Mode
	H       uint64
	Keyed   bool
	Digests []string
}

// Tier weights: a prefix in memory is restored at once, one on the SSD is read back
// first (still far faster than a prefill on a Mac).
var tierWeight = map[string]float64{"hot": 1, "ssd": 0.5}

// TierWeight is what a prefix held in tier is worth against one held in another: a
// prefix in memory is restored at once, one on the SSD is read back first.
func TierWeight(tier string) float64 { return tierWeight[tier] }

// inflightWeight is what a prefix being prefilled on a replica (prefixindex.InFlight)
// is worth, against the tiers': less than one on the SSD, which is there to restore
// now, where this one is there only once its prefill ends.
const inflightWeight = 0.4

// prefixCandidate is one replica as choosePrefix sees it: the deepest prefix of the
// request it holds, the depth of the deepest one a request routed there is
// prefilling (prefilling; prefilled: those requests ended, the index not told yet —
// the score counts both alike since the runner shares an in-flight prefix),
// the gateway's requests in flight on it and its sequence slots.
type prefixCandidate struct {
	hit        prefixindex.Hit
	prefilling int
	prefilled  bool
	load       int
	slots      int
}

// prefixScore is what a replica's held prefix is worth to a request: the prompt
// tokens it spares (its depth in digests when the runner did not say), weighted by
// tier, times the share of the replica's slots the request would get — slots over
// slots + requests in flight + requests queued behind them (those beyond its slots,
// this one included) — so that a replica that holds a prefix but is saturated is
// worth less than one that holds less and is idle. A prefix being prefilled there
// counts too, whether or not a slot is free: the runner lets a request wait for a
// prefix another of its slots is prefilling and takes its KV once fed (see
// docs/prompt-cache.md, "In-flight prefixes"), where it used to prefill the same
// tokens again beside it. It counts as its depth (its tokens are known only once the
// runner reports the save) weighted by inflightWeight, below every tier's, and the
// better of the two is the score: a held prefix whose tokens were reported outweighs
// one in flight, which matters when nobody holds the prefix yet or its holders are
// beyond the load bound. 0 when it holds nothing of the request and prefills nothing.
func prefixScore(c prefixCandidate) float64 {
	slots := max(c.slots, 1)
	prefilling := c.prefilling
	if c.hit.Depth == 0 && prefilling == 0 {
		return 0
	}
	saved := float64(c.hit.Tokens)
	if saved <= 0 {
		saved = float64(c.hit.Depth)
	}
	worth := max(tierWeight[c.hit.Tier]*saved, inflightWeight*float64(prefilling))
	queued := max(c.load+1-slots, 0)
	return worth * float64(slots) / float64(slots+c.load+queued)
}

// choosePrefix returns the eligible replica with the best prefixScore among those
// that may take the request: a replica with a sequence slot free (load < slots) that
// holds or prefills some of the request's prefix, and any replica whose load after
// taking the request stays within ceil(c × (total load + 1) / eligible replicas) —
// the bound of consistent hashing with bounded loads, so a hot prefix spills over to
// other replicas once its holders' slots are full instead of queueing behind them.
// With few requests in the fleet the bound is one a replica, and without the free
// slot's exception a tenant's second request, arriving while its first prefills or is
// answered on R, went elsewhere and prefilled the same prefix cold. Ties go to the
// less loaded, then the first. -1 when no replica that may take the request holds
// any of its prefix: the caller falls back.
func choosePrefix(cands []prefixCandidate, eligible []bool, c float64) int {
	n, total := 0, 0
	for i, ok := range eligible {
		if ok {
			n++
			total += cands[i].load
		}
	}
	if n == 0 {
		return -1
	}
	bound := int(math.Ceil(c * float64(total+1) / float64(n)))
	best, bestScore := -1, 0.0
	for i, cand := range cands {
		if !eligible[i] || (cand.load+1 > bound && cand.load >= max(cand.slots, 1)) {
			continue
		}
		s := prefixScore(cand)
		if s > bestScore || (s == bestScore && s > 0 && cand.load < cands[best].load) {
			best, bestScore = i, s
		}
	}
	return best
}

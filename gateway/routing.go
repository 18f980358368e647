package gateway

import (
	"context"
	"fmt"
	"math"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/gateway/prefixindex"
)

// Routing is how the gateway picks a replica of a deployment for a request.
type Routing string

const (
	// RoutingPrefixCache routes a conversation to the replica whose prompt cache holds
	// the longest part of it, by the prefix index (package prefixindex), weighted by
	// tier and load (choosePrefix); with no replica holding any of it, by affinity on
	// its prompt_cache_key when it has one, else (and for deployments with the prompt
	// cache off) by least load.
	RoutingPrefixCache Routing = "prefix-cache"
	// RoutingPrefixAffinity hashes the start of the conversation onto the replicas
	// (consistent hashing with bounded loads).
	RoutingPrefixAffinity Routing = "prefix-affinity"
	// RoutingLeastLoad takes the replica with the fewest requests in flight.
	RoutingLeastLoad Routing = "least-load"
)

// Routings lists the modes, the flag's values.
var Routings = []Routing{RoutingPrefixCache, RoutingPrefixAffinity, RoutingLeastLoad}

// ParseRouting reads a --routing value.
func ParseRouting(s string) (Routing, error) {
	for _, r := range Routings {
		if string(r) == s {
			return r, nil
		}
	}
	names := make([]string, len(Routings))
	for i, r := range Routings {
		names[i] = string(r)
	}
	return "", fmt.Errorf("unknown routing %q: use one of %s", s, strings.Join(names, ", "))
}

// ResolveRouting is the mode that --routing (set: given on the command line) and the
// older --prefix-affinity select: --prefix-affinity=true is
// --routing=prefix-affinity, and an error when --routing names another mode.
func ResolveRouting(routing string, set, prefixAffinity bool) (Routing, error) {
	r, err := ParseRouting(routing)
	if err != nil {
		return "", fmt.Errorf("--routing: %w", err)
	}
	if !prefixAffinity {
		return r, nil
	}
	if set && r != RoutingPrefixAffinity {
		return "", fmt.Errorf("--prefix-affinity is --routing=%s, but --routing=%s was given: give --routing alone",
			RoutingPrefixAffinity, r)
	}
	return RoutingPrefixAffinity, nil
}

// How a request's replica was picked, as the routing decisions metric and the
// request's span name it.
const (
	routedPrefixHit      = "prefix_hit"
	routedPrefixInFlight = "prefix_inflight"
	routedFallback       = "fallback"
	routedPrefixAffinity = "prefix_affinity"
	routedLeastLoad      = "least_load"
)

// routeHint is what of a request picks its replica: the mode, under
// RoutingPrefixAffinity the hash of its prefix, under RoutingPrefixCache its prefix
// digests and, when it has a prompt_cache_key (keyed), the key's hash.
type routeHint struct {
	mode    Routing
	h       uint64
	keyed   bool
	digests []string
}

// Tier weights: a prefix in memory is restored at once, one on the SSD is read back
// first (still far faster than a prefill on a Mac).
var tierWeight = map[string]float64{"hot": 1, "ssd": 0.5}

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

// routed records how t's current replica was picked: the routing decisions metric and
// the request's span.
func (g *Gateway) routed(ctx context.Context, t *ticket) {
	if t.routed == "" {
		return
	}
	g.metrics.routing.WithLabelValues(t.model, t.routed).Inc()
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("macfleet.routing", t.routed),
			attribute.Int("macfleet.prefix.digests", len(t.hint.digests)))
	}
}

type prefixDigestsKey struct{}

// prefixDigests are a request's prefix digests: all of them, sent to the agent, and
// those worth routing by (prefixdigest.Conversation.Routable).
type prefixDigests struct{ all, routable []string }

// withPrefixDigests carries a request's prefix digests to its attempts, which send
// them all to the agent (runnerapi.HeaderPrefixDigests) and look for a peer holding
// the routable ones.
func withPrefixDigests(ctx context.Context, all, routable []string) context.Context {
	return context.WithValue(ctx, prefixDigestsKey{}, prefixDigests{all: all, routable: routable})
}

func prefixDigestsFrom(ctx context.Context) prefixDigests {
	d, _ := ctx.Value(prefixDigestsKey{}).(prefixDigests)
	return d
}

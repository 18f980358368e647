package peerfetch

import (
	"cmp"
	"slices"
	"time"
)

// Warm-up: a replica that starts holding nothing (a new replica, a rescheduled one, a
// restarted runner) while replicas of its deployment on other Macs hold prefixes is
// warmed from them before requests reach it. ChooseWarmups decides which states, a
// pure function of the candidates; Recent is the record of the conversations routed
// lately that the candidates come from (the prefix index knows digests, not whose
// partition they are in, nor when they were last asked for).

// Warm-up bounds.
const (
	// DefaultWarmLimit bounds the states one warm-up fetches
	// (runnerapi.MaxWarmHints, the agent's bound).
	DefaultWarmLimit = 16
	// DefaultWarmMaxAge: a conversation not routed for this long is not warmed.
	DefaultWarmMaxAge = 30 * time.Minute
	// DefaultRecentPerDeployment bounds Recent's conversations per deployment, and
	// DefaultRecentDeployments its deployments.
	DefaultRecentPerDeployment = 64
	DefaultRecentDeployments   = 4096
)

// Candidate is a state a cold replica could warm from: the digest a replica of its
// deployment on another Mac (Source) holds, the partition it was asked in, when a
// request of it was last routed, when that conversation was last routed to the cold
// replica's own Mac (TargetServed; zero: never), and the decision's inputs
// for fetching it over the link from Source's Mac (Inputs.Tokens: what it spares).
type Candidate struct {
	Digest, Partition, Source string
	LastHit, TargetServed     time.Time
	Inputs                    Inputs
}

// Warmup is a chosen candidate and its decision.
type Warmup struct {
	Candidate
	Decision Decision
}

// ChooseWarmups picks, of cands, at most limit states to warm (DefaultWarmLimit when
// ≤ 0): the ones last hit within maxAge of now (DefaultWarmMaxAge when ≤ 0), of a
// conversation the cold replica's Mac itself was sent within maxAge (a Mac sees the
// prompts routed to it, never the other conversations of their partition:
// docs/security.md), that
// Decide says are worth fetching, one per digest and partition, the most tokens
// first, then the most recently hit, then by digest (so the choice is stable).
func ChooseWarmups(cands []Candidate, now time.Time, maxAge time.Duration, limit int) []Warmup {
	if limit <= 0 {
		limit = DefaultWarmLimit
	}
	if maxAge <= 0 {
		maxAge = DefaultWarmMaxAge
	}
	type key struct{ digest, partition string }
	best := map[key]Warmup{}
	for _, c := range cands {
		if c.Digest == "" || now.Sub(c.LastHit) > maxAge || c.TargetServed.IsZero() || now.Sub(c.TargetServed) > maxAge {
			continue
		}
		d := Decide(c.Inputs)
		if !d.Fetch {
			continue
		}
		k := key{c.Digest, c.Partition}
		w := Warmup{Candidate: c, Decision: d}
		if prev, ok := best[k]; !ok || warmBefore(w, prev) {
			best[k] = w
		}
	}
	out := make([]Warmup, 0, len(best))
	for _, w := range best {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b Warmup) int {
		if warmBefore(a, b) {
			return -1
		}
		if warmBefore(b, a) {
			return 1
		}
		return 0
	})
	return out[:min(len(out), limit)]
}

// warmBefore orders warm-ups: the most tokens, the most recent hit, then the fastest
// transfer, then digest, partition and source.
func warmBefore(a, b Warmup) bool {
	if c := cmp.Or(
		cmp.Compare(b.Inputs.Tokens, a.Inputs.Tokens),
		b.LastHit.Compare(a.LastHit),
		cmp.Compare(a.Decision.Transfer, b.Decision.Transfer),
		cmp.Compare(a.Digest, b.Digest),
		cmp.Compare(a.Partition, b.Partition),
		cmp.Compare(a.Source, b.Source),
	); c != 0 {
		return c < 0
	}
	return false
}

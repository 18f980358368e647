package speculate

import (
	"math/bits"
	"time"
)

// Costs are the step times a runner measured, by how many tokens the step's batch
// held, for deciding whether drafts pay (Pays). A drafted token is free where the
// step is bound by reading the weights once for all its rows (a large model on a
// card, a Mac's unified memory), and costs nearly a decoded token where the step is
// bound by per-row work (a CPU's matrix products, reading and sampling each row's
// logits over a large vocabulary): only the runner's own timings tell which, on this
// machine, for this model, at this load. The zero Costs knows nothing.
type Costs struct {
	// ewma[bucket(n)] is the smoothed seconds of a step whose batch held n tokens;
	// zero where none was measured.
	ewma [buckets]float64
}

const (
	// exactSizes: batches of 1 to exactSizes tokens each have their own average
	// (bucket). Where a step's rows cost their own work, a batch of 17 tokens costs
	// more than one of 16, and sizes that shared a power-of-two bucket made each
	// draft within a bucket look free: sixteen streams drafted one token in seven,
	// kept a quarter of them, and ran at 0.84–0.95× of no drafts.
	exactSizes = 64
	// buckets: the exact sizes, then power-of-two buckets of larger batches (the
	// last takes the rest).
	buckets = exactSizes + 6
	// alpha is the weight of a new measurement in its bucket's average.
	alpha = 0.2
)

// bucket is n's bucket: n-1 for 1 to exactSizes tokens (0 for none), then 65–128 →
// exactSizes, 129–256 → exactSizes+1, … (the last takes the rest).
func bucket(n int) int {
	if n <= exactSizes {
		return max(n-1, 0)
	}
	return min(exactSizes+bits.Len(uint(n-1))-bits.Len(exactSizes), buckets-1)
}

// Observe records a step of n tokens that took seconds (decode, reading and sampling
// the rows: the step's whole time between batches).
func (c *Costs) Observe(n int, seconds float64) {
	if n <= 0 || seconds <= 0 {
		return
	}
	b := bucket(n)
	if c.ewma[b] == 0 {
		c.ewma[b] = seconds
		return
	}
	c.ewma[b] += alpha * (seconds - c.ewma[b])
}

// Time is the expected seconds of a step of n tokens and whether n's bucket was
// measured. Never measured, a size between two measured ones of the exact sizes
// costs what a straight line between them gives; any other, the nearest smaller
// measured bucket's time, which assumes a larger batch costs no more: what makes a
// runner try a draft once and so measure it.
func (c *Costs) Time(n int) (float64, bool) {
	sec, how := c.estimate(n)
	return sec, how == measured
}

// known reports whether a step of n tokens has a time of its own or lies between two
// measured sizes of the exact ones (Time's straight line).
func (c *Costs) known(n int) bool {
	_, how := c.estimate(n)
	return how == measured || how == between
}

// How Costs.estimate came by a step's time.
const (
	unknown  = iota // nothing measured at or below the size
	measured        // the size's own average
	between         // the straight line between two measured exact sizes
	below           // the nearest smaller measured size's average
)

// estimate is Time's value for a step of n tokens and how it came by it.
func (c *Costs) estimate(n int) (float64, int) {
	b := bucket(n)
	if c.ewma[b] > 0 {
		return c.ewma[b], measured
	}
	lo := b - 1
	for lo >= 0 && c.ewma[lo] == 0 {
		lo--
	}
	if lo < 0 {
		return 0, unknown
	}
	if b < exactSizes {
		for hi := b + 1; hi < exactSizes; hi++ {
			if c.ewma[hi] > 0 {
				return c.ewma[lo] + (c.ewma[hi]-c.ewma[lo])*float64(b-lo)/float64(hi-lo), between
			}
		}
	}
	return c.ewma[lo], below
}

// Pays reports whether drafts of drafted tokens into a plain step of base tokens,
// expected to keep kept of them, raise the runner's rate: the plain step makes base
// tokens in plain.near(base), and with the drafts base+kept tokens in that time plus
// extra.Time(drafted) (what the drafts add), so they pay when
// kept > base·extra/plain. With no plain step measured they pay (the step then
// measures one); a plain size never measured takes the nearest measured one's time,
// as a count of drafted tokens never measured takes Time's estimate. (A size never
// measured once let every draft through, and a step with drafts measures no plain
// time: at sixteen streams on a card, as answers ended and their slots emptied, each
// step of the sizes left drafted, each costing more than it kept.)
func Pays(plain, extra *Costs, base, drafted int, kept float64) bool {
	if drafted <= 0 {
		return false
	}
	t := plain.near(base)
	if t <= 0 {
		return true
	}
	x, _ := extra.Time(drafted)
	return kept > float64(base)*x/t
}

// near is the expected seconds of a step of n tokens (Time), or where nothing is
// measured at or below n, the nearest larger measured size's; zero where nothing is
// measured.
func (c *Costs) near(n int) float64 {
	if sec, how := c.estimate(n); how != unknown {
		return sec
	}
	for b := bucket(n) + 1; b < buckets; b++ {
		if c.ewma[b] > 0 {
			return c.ewma[b]
		}
	}
	return 0
}

// Rate is a slot's running share of drafted tokens kept, for the expected count a
// draft keeps (Expect). The zero Rate starts at an even chance.
type Rate struct {
	kept, drafted float64
	// tried is every drafted token noted, not decayed (Untried).
	tried int
}

// rateDecay is how much of the past a Rate keeps at each draft.
const rateDecay = 0.8

// Note records a draft of proposed tokens of which accepted were kept.
func (r *Rate) Note(proposed, accepted int) {
	if proposed <= 0 {
		return
	}
	r.kept = rateDecay*r.kept + float64(accepted)
	r.drafted = rateDecay*r.drafted + float64(proposed)
	r.tried += proposed
}

// Share is the running share of drafted tokens kept (one half before any draft).
func (r Rate) Share() float64 {
	if r.drafted == 0 {
		return 0.5
	}
	return r.kept / r.drafted
}

// Untried reports whether fewer than triedAfter tokens were ever drafted from the
// source: a source's first drafts are let through whatever they are expected to
// keep, or a source that starts below what a draft costs would never be tried and so
// never learnt (Gate.Allows). The count is not the decayed share's: drafts of one
// token (a policy's size after a miss) keep that at 5 for good, and a source judged
// untried for good drafts one a step, every step.
func (r Rate) Untried() bool { return r.tried < triedAfter }

// triedAfter is how many drafted tokens a Rate must rest on to be trusted.
const triedAfter = 8

// Expect is how many of a draft of d tokens are expected to be kept, where each is
// kept with the running share p only if every one before it was: p + p² + … + p^d.
func (r Rate) Expect(d int) float64 {
	p, sum, term := r.Share(), 0.0, 1.0
	for range d {
		term *= p
		sum += term
	}
	return sum
}

// Source is where a draft came from; each keeps its own running share of tokens
// kept (Rates). A prompt lookup's draft found by a match of n tokens is FromLookup(n):
// in a turn that quotes a file a 3-token match is nearly always kept, while the
// 1-token matches of the answer's first words (a file name the prompt holds, followed
// there by other words) nearly never are, and one share for both let those first
// misses hold the quote back.
type Source uint8

const (
	// FromModel is a draft model's greedy tokens.
	FromModel Source = iota
	// FromPrediction is a request's prediction (Follow).
	FromPrediction
	// fromLookup is FromLookup(1); longer matches follow it, up to lookupSources.
	fromLookup
	lookupSources = 4
	sources       = fromLookup + lookupSources
)

// FromLookup is the Source of a prompt lookup's draft found by a match of n tokens
// (n beyond lookupSources shares the last).
func FromLookup(n int) Source { return fromLookup + Source(min(max(n, 1), lookupSources)-1) }

// Rates are the running shares of drafted tokens kept, by Source. The zero Rates
// starts every source at an even chance.
type Rates [sources]Rate

// Note records a verified draft from src of proposed tokens of which accepted were kept.
func (r *Rates) Note(src Source, proposed, accepted int) { r[src].Note(proposed, accepted) }

// Expect is how many of a draft of d tokens from src are expected to be kept (Rate.Expect).
func (r *Rates) Expect(src Source, d int) float64 { return r[src].Expect(d) }

// Gate decides whether the drafts of slots that left speculation to the runner (no
// HeaderSpeculation) are expected to pay on this machine: from the engine's own step
// times (Costs, measured on steps without a prefill) and the slots' running shares of
// drafts kept, by where the drafts came from (Rates). A draft verified in the same
// pass is nearly free where a step reads the weights once for all its rows (a large
// model on a Mac or a card) and costs almost a decoded token where each row costs its
// own work (a CPU's small models; a small model on a card, whose single-token steps
// run as CUDA graphs and whose rows of logits span a large vocabulary). Every
// ExploreEvery-th step lets a draft through anyway (Tries), so that a time measured
// under a passing load is measured again. The zero Gate knows nothing (and so lets drafts
// through).
//
// What it measures: plain steps' times by their size, and what drafts add to a step,
// by how many slots drafted and how many tokens they drafted, whatever the step's
// size. llama.cpp keeps a KV stream a slot and computes a batch as micro-batches of
// consecutive sequences holding the same number of tokens each: a step of sixteen
// slots where one drafts runs as two graphs (the sixteen next tokens, then that
// slot's draft), where two draft as three. On an accelerator each graph is another
// launch, or another pass over the weights, so a draft of 6 by one slot and drafts of
// 3 by two cost differently at the same size; on a CPU what a draft adds is its rows'
// work. Neither depends much on how many slots decode beside the drafts, and keyed by
// the step's size the times had to be learnt again for every number of streams.
type Gate struct {
	// plain are the plain steps' times by size; extra[k] what the drafts of k slots
	// (the last table takes more) add to a plain step, by the tokens they drafted.
	plain Costs
	extra [drafterTables]Costs
	steps int
	// lastDrafted: the previous step held drafts (or a prefill), another shape of
	// batch than a plain decode's; pending is that step's measure, waiting to be
	// charged with what it cost the step after it.
	lastDrafted bool
	pending     struct {
		base, drafted, table int
		seconds              float64
		ok                   bool
	}
	// tried marks the buckets whose first step was seen, the plain sizes' and each
	// table's: that step is not measured (observe).
	tried [drafterTables][buckets]bool
	// rates are the shares of drafted tokens kept over every slot, by source, the
	// prior of a new answer's own (Prior): a runner whose drafts from a source keep
	// failing does not start each answer at an even chance for it.
	rates Rates
}

// drafterTables: plain steps (tried[0]), then steps in which 1, 2, …
// drafterTables-1 or more slots drafted, each with their own extra times.
const drafterTables = 5

// table is the extra-time table of a step in which drafters slots drafted.
func table(drafters int) int { return min(max(drafters, 1), drafterTables-1) }

// ExploreEvery is how often a Gate lets a draft through whatever the times say.
const ExploreEvery = 256

// Plan is a step's drafts admitted so far (Gate.Add), which the next slot's draft is
// judged with (Gate.Allows).
type Plan struct {
	// Base is the step's tokens without drafts.
	Base int
	// Drafted is the drafted tokens admitted, Drafters the slots they belong to and
	// Kept how many of them they are expected to keep.
	Drafted, Drafters int
	Kept              float64
	// unknown: a draft admitted into a count its table has no time for.
	unknown bool
}

// Note records a verified draft from src of proposed tokens of which accepted were kept.
func (g *Gate) Note(src Source, proposed, accepted int) { g.rates.Note(src, proposed, accepted) }

// Tries reports whether a draft from src may be let through whatever it is expected
// to keep, to learn from it: the runner's drafts from src so far are too few to judge
// them by (Rate.Untried), or this step explores (every ExploreEvery-th). The engine
// lets one such draft through a step: on a card an exploring step where every slot
// drafted made a step of sixteen micro-batches, about six plain steps, once every 256.
func (g *Gate) Tries(src Source) bool {
	return g.rates[src].Untried() || g.steps%ExploreEvery == 0
}

// Prior is a new answer's starting Rates: the runner's own so far.
func (g *Gate) Prior() Rates { return g.rates }

// Allows reports whether one more slot's draft of d tokens, expected to keep kept of
// them, pays in the step planned so far as p (its drafts all expected to keep what
// they keep): what the step's drafts would add to a plain step of p.Base tokens
// against the tokens they are expected to keep; or the draft is one the runner tries
// (Tries). One draft a step may reach a count of drafted tokens its table has no time
// for (Time takes it for the nearest smaller count's, which lets the draft through to
// measure it): sixteen slots each drafting into unmeasured sizes made a step of 62
// tokens where 16 plain ones were the rule, which cost six plain steps on a card and
// kept 16 of its 46 drafted tokens.
func (g *Gate) Allows(p Plan, d int, kept float64, try bool) bool {
	with := &g.extra[table(p.Drafters+1)]
	n := p.Drafted + d
	if p.unknown && !with.known(n) {
		return false
	}
	return try || Pays(&g.plain, with, p.Base, n, p.Kept+kept)
}

// Add admits one more slot's draft of d tokens, expected to keep kept, into p.
func (g *Gate) Add(p *Plan, d int, kept float64) {
	if !g.extra[table(p.Drafters+1)].known(p.Drafted + d) {
		p.unknown = true
	}
	p.Drafted += d
	p.Drafters++
	p.Kept += kept
}

// Stepped records a step of n tokens, drafted of them by drafters slots, that took
// d; or a prefill (mixed), which is counted but not measured. A batch of another
// shape than the step before costs the step after it too (a card's one-token steps
// run as a recorded graph, recorded again after a batch of another size), so a
// drafting step that follows a plain one is charged with what the plain step after it
// took beyond a plain step's time; a plain step after another shape is not measured
// as plain.
func (g *Gate) Stepped(n, drafted int, d time.Duration, mixed bool, drafters int) {
	g.steps++
	prev := g.lastDrafted
	g.lastDrafted = drafters > 0 || mixed
	sec := d.Seconds()
	switch {
	case mixed:
		g.pending.ok = false
	case drafters > 0 && prev:
		g.observeDrafts(n-drafted, drafted, table(drafters), sec) // no change of shape
	case drafters > 0:
		g.pending.base, g.pending.drafted, g.pending.table = n-drafted, drafted, table(drafters)
		g.pending.seconds, g.pending.ok = sec, true
	case prev:
		if plain, ok := g.plain.Time(n); ok && g.pending.ok {
			g.observeDrafts(g.pending.base, g.pending.drafted, g.pending.table, g.pending.seconds+max(0, sec-plain))
		}
		g.pending.ok = false
	default:
		if g.firstOf(0, n) {
			return
		}
		g.plain.Observe(n, sec)
	}
}

// observeDrafts measures what drafted tokens by the slots of table t added to a
// plain step of base tokens, in a step that took sec; not without a plain time for
// base. (A step's drafts may add nothing measurable: they are measured as adding a
// nanosecond, Costs' zero being "not measured".)
func (g *Gate) observeDrafts(base, drafted, t int, sec float64) {
	plain, ok := g.plain.Time(base)
	if !ok || g.firstOf(t, drafted) {
		return
	}
	g.extra[t].Observe(drafted, max(sec-plain, 1e-9))
}

// firstOf reports whether this is the first step of n's bucket in table t (0: the
// plain steps), and marks it seen: the first step of a batch shape sets up what the
// later ones reuse (buffers on a CPU, a recorded graph on a card), and one such step
// made the average of a size whose later steps cost a quarter of it, so that no draft
// of that size passed again to measure it.
func (g *Gate) firstOf(t, n int) bool {
	if b := bucket(n); !g.tried[t][b] {
		g.tried[t][b] = true
		return true
	}
	return false
}

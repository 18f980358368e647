package speculate

// Policy is one slot's drafting policy: how many tokens it drafts at a step. A draft
// that is taken whole doubles the next one (up to Max); one cut short drafts one more
// than it kept; a run of drafts that keep nothing stops drafting for a cool-down that
// doubles each time (up to maxCool steps), so a turn with nothing to copy costs almost
// nothing. The zero Policy is not usable: start from NewPolicy.
type Policy struct {
	Max    int // the most tokens a draft holds
	k      int // the next draft's size
	misses int // drafts in a row that kept nothing
	skip   int // steps left without drafting
	cool   int // the next cool-down's steps
}

// Tuning of the policy.
const (
	// DefaultMax is the most tokens a draft holds.
	DefaultMax = 8
	// startK is a fresh slot's first draft size.
	startK = 4
	// missLimit is how many drafts in a row may keep nothing before a cool-down.
	missLimit = 2
	// firstCool and maxCool bound a cool-down's steps.
	firstCool, maxCool = 8, 128
)

// NewPolicy is a slot's fresh policy with drafts of at most max tokens.
func NewPolicy(max int) Policy {
	if max < 1 {
		max = 1
	}
	return Policy{Max: max, k: min(startK, max), cool: firstCool}
}

// Size is how many tokens to draft at this step (0: none); room bounds it (the
// batch's, the context's and the answer's room). strong is a draft found by a long
// match (Lookup's maxN tokens), which a cool-down lets through: a turn that starts
// quoting drafts from the first words it quotes. A cool-down counts down each step.
func (p *Policy) Size(room int, strong bool) int {
	if p.skip > 0 {
		p.skip--
		if !strong {
			return 0
		}
	}
	return max(0, min(p.k, room))
}

// Note records a verified draft of proposed tokens of which accepted were kept.
func (p *Policy) Note(proposed, accepted int) {
	if proposed == 0 {
		return
	}
	switch {
	case accepted == proposed:
		p.k = min(2*p.k, p.Max)
	default:
		p.k = max(1, min(accepted+1, p.Max))
	}
	if accepted > 0 {
		p.misses, p.cool = 0, firstCool
		return
	}
	p.misses++
	if p.misses >= missLimit {
		p.skip, p.misses = p.cool, 0
		p.cool = min(2*p.cool, maxCool)
		p.k = min(startK, p.Max)
	}
}

// Cooling reports whether the policy is in a cool-down.
func (p *Policy) Cooling() bool { return p.skip > 0 }

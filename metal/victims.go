package metal

import (
	"cmp"
	"slices"
	"time"
)

// victimCandidate is a model that could be unloaded to make room.
type victimCandidate struct {
	Name     string
	LastUsed time.Time
	// Bytes is what unloading it is expected to free: the larger of its measured
	// footprint and its reservation.
	Bytes int64
}

// selectVictim picks the model to unload. With a byte target (> 0): the least
// recently used candidate that alone frees at least target; if none does, the
// largest. Without a target: plain LRU. LRU ties go to the larger model, then to the
// name; size ties to the less recently used, then to the name. It is pure.
func selectVictim(cands []victimCandidate, target int64) (victimCandidate, bool) {
	if len(cands) == 0 {
		return victimCandidate{}, false
	}
	lru := slices.Clone(cands)
	slices.SortFunc(lru, func(a, b victimCandidate) int {
		if c := a.LastUsed.Compare(b.LastUsed); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Bytes, a.Bytes); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	if target <= 0 {
		return lru[0], true
	}
	for _, c := range lru {
		if c.Bytes >= target {
			return c, true
		}
	}
	largest := slices.MinFunc(lru, func(a, b victimCandidate) int {
		if c := cmp.Compare(b.Bytes, a.Bytes); c != 0 {
			return c
		}
		if c := a.LastUsed.Compare(b.LastUsed); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return largest, true
}

// victimCandidatesLocked lists the entries eviction may pick: Ready, not pinned, no
// lease held, not the entry being admitted. Loading, Draining and Stopping entries
// are never candidates. Leases are the authority on activity: a request holds its
// lease from routing to its last byte, so no request is active without one.
func (p *Pool) victimCandidatesLocked(exclude *entry) []victimCandidate {
	var out []victimCandidate
	for _, e := range p.entries {
		if e == exclude || e.state != StateReady || e.spec.Residency == Pinned {
			continue
		}
		g := e.eng
		if g == nil || g.inUse > 0 || g.tearingDown {
			continue
		}
		out = append(out, victimCandidate{Name: e.spec.Name, LastUsed: e.lastUsed, Bytes: max(g.footprint, g.reservation)})
	}
	return out
}

// pickVictimLocked selects and returns a victim entry, or nil.
func (p *Pool) pickVictimLocked(exclude *entry, target int64) *entry {
	v, ok := selectVictim(p.victimCandidatesLocked(exclude), target)
	if !ok {
		return nil
	}
	return p.entries[v.Name]
}

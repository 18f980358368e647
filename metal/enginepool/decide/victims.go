package decide

import (
	"cmp"
	"slices"
	"time"
)

// Candidate is a model that could be unloaded to make room.
type Candidate struct {
	Name     string
	LastUsed time.Time
	// Bytes is what unloading it is expected to free: the larger of its measured
	// footprint and its reservation.
	Bytes int64
}

// SelectVictim picks the model to unload. With a byte target (> 0): the least
// recently used candidate that alone frees at least target; if none does, the
// largest. Without a target: plain LRU. LRU ties go to the larger model, then to the
// name; size ties to the less recently used, then to the name.
func SelectVictim(cands []Candidate, target int64) (Candidate, bool) {
	if len(cands) == 0 {
		return Candidate{}, false
	}
	lru := slices.Clone(cands)
	slices.SortFunc(lru, func(a, b Candidate) int {
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
	largest := slices.MinFunc(lru, func(a, b Candidate) int {
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

// Candidates lists the models eviction may pick: Ready, not pinned, no lease held,
// not being torn down, not exclude (the model being admitted). Loading, Draining and
// Stopping models never are. Leases are the authority on activity: a request holds
// its lease from routing to its last byte, so no request is active without one.
func Candidates(models []Model, exclude string) []Candidate {
	var out []Candidate
	for i := range models {
		m := &models[i]
		if m.Name == exclude || m.State != StateReady || m.Pinned {
			continue
		}
		g := m.Engine
		if g == nil || g.InUse > 0 || g.TearingDown {
			continue
		}
		out = append(out, Candidate{Name: m.Name, LastUsed: m.LastUsed, Bytes: g.Bytes()})
	}
	return out
}

// Victim is SelectVictim over Candidates: the model to unload to free target bytes
// (0: plain LRU), if any.
func Victim(models []Model, exclude string, target int64) (string, bool) {
	v, ok := SelectVictim(Candidates(models, exclude), target)
	return v.Name, ok
}

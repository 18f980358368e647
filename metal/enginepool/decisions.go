package enginepool

import "github.com/macfleet/macfleet/metal/enginepool/decide"

// decideSnapshotLocked is the pool as its decisions (package decide) read it.
func (p *Pool) decideSnapshotLocked() decide.Snapshot {
	return decide.Snapshot{
		Now:       p.clock.Now(),
		Limits:    p.ceiling.limits(),
		Level:     p.level,
		Usage:     p.usage,
		Committed: p.committed,
		Models:    p.decideModelsLocked(),
	}
}

// decideModelsLocked lists every entry with its current engine.
func (p *Pool) decideModelsLocked() []decide.Model {
	ms := make([]decide.Model, 0, len(p.entries))
	for _, e := range p.entries {
		m := decide.Model{Name: e.spec.Name, State: e.state, Pinned: e.spec.Residency == Pinned,
			IdleTimeout: e.idleTimeout(p.cfg.IdleTimeout), LastUsed: e.lastUsed}
		if g := e.eng; g != nil {
			_, running := p.engines[g]
			m.Engine = &decide.Engine{Running: running, TearingDown: g.tearingDown, InUse: g.inUse,
				Footprint: g.footprint, Reservation: g.reservation, OwnCeiling: g.ownCeiling(),
				OverCeiling: g.overCeiling}
		}
		ms = append(ms, m)
	}
	return ms
}

// limits are the ceiling's bytes and watermarks.
func (c Ceiling) limits() decide.Limits {
	return decide.Limits{Ceiling: c.Bytes, Soft: c.SoftBytes, Hard: c.HardBytes}
}

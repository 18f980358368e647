package enginepool

import (
	"context"
	"sync"
)

// meter measures the runners: their footprints from outside (the gauge) and the
// reports they give of themselves (status). It reads the runners to measure from the
// state and records what it measured there (state.record); the state's lock is never
// held while it measures.
type meter struct {
	deps
	st *state
}

// footprints measures every runner from outside and the agent itself, records the
// figures, and returns their sum (the measured pool footprint).
func (m meter) footprints() int64 {
	v := m.st.view(query{runners: true})
	var fps []footprint
	for _, t := range v.runners {
		if t.pid <= 0 {
			continue
		}
		fp, err := m.gauge.Process(t.pid)
		fps = append(fps, footprint{g: t.g, bytes: fp, ok: err == nil})
	}
	var agent int64
	if v.agentPID > 0 {
		if fp, err := m.gauge.Process(v.agentPID); err == nil {
			agent = fp
		}
	}
	return m.st.record(measurement{kind: measuredFootprints, footprints: fps, agent: agent})
}

// statuses reads the prompt cache report of every live runner whose model enables
// the cache, and the link report of every split head's.
func (m meter) statuses() {
	var wg sync.WaitGroup
	for _, t := range m.st.view(query{runners: true}).runners {
		if !t.status {
			continue
		}
		m.clock.goCall(&wg, m.cfg.RunnerCallTimeout, "reading the status of "+t.name, func(ctx context.Context) {
			st, err := t.r.Status(ctx)
			if err != nil {
				return
			}
			r := measurement{kind: measuredStatus, g: t.g, chat: st.Chat, split: splitStats(&st), off: st.Off}
			if st.PromptCache != nil && t.g.spec.PromptCache.Enabled {
				r.cache = promptCacheStats(st.PromptCache)
				r.cache.Enabled = true
			}
			m.st.record(r)
		})
	}
	wg.Wait()
}

// record applies a measurement. For footprints it returns the measured pool
// footprint: the runners' (a runner that could not be measured counts its last
// figure, unless it is being stopped and gone) plus the agent's.
func (s *state) record(m measurement) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch m.kind {
	case measuredBudget:
		m.g.hotBudget = m.hotBudget
	case measuredStatus:
		g := m.g
		if m.chat != nil {
			g.chat = m.chat
		}
		g.split, g.off = m.split, m.off
		if e := g.entry; e.eng == g {
			e.lastOff = m.off
		}
		if m.cache == nil {
			return 0
		}
		m.cache.HotShareBytes = g.hotShare
		g.cache = m.cache
		if e := g.entry; e.eng == g {
			e.lastCache = m.cache
		}
	case measuredFootprints:
		sum := m.agent
		for _, f := range m.footprints {
			switch {
			case f.ok:
				f.g.footprint = f.bytes
				f.g.peak = max(f.g.peak, f.bytes)
			case f.g.tearingDown:
				continue // being stopped and gone: its memory is on its way back
			}
			sum += f.g.footprint
		}
		s.agentBytes = m.agent
		return sum
	}
	return 0
}

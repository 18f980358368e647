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
			if st, err := t.r.Status(ctx); err == nil {
				m.st.record(measurement{kind: measuredStatus, g: t.g, status: &st})
			}
		})
	}
	wg.Wait()
}

// measurementKind names what a measurement is.
type measurementKind int

const (
	measuredFootprints measurementKind = iota
	measuredStatus
	measuredBudget
)

// measurement is what a measurement or a runner call gave back, to record.
type measurement struct {
	kind measurementKind
	// measuredFootprints: each runner's footprint and the agent's.
	footprints []footprint
	agent      int64
	// measuredStatus and measuredBudget: one runner's status, or the hot budget it
	// confirmed.
	g         *engine
	status    *RunnerStatus
	hotBudget int64
}

// footprint is one runner's footprint as measured (ok: the gauge answered).
type footprint struct {
	g     *engine
	bytes int64
	ok    bool
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
		g, st := m.g, m.status
		if st.Chat != nil {
			g.chat = st.Chat
		}
		g.split = splitStats(st)
		if st.PromptCache == nil || !g.spec.PromptCache.Enabled {
			return 0
		}
		c := promptCacheStats(st.PromptCache)
		c.Enabled = true
		c.HotShareBytes = g.hotShare
		g.cache = c
		if e := g.entry; e.eng == g {
			e.lastCache = c
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

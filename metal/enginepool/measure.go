package enginepool

import (
	"context"
	"sync"
)

// meter measures the runners: their footprints from outside (the gauge) and the
// reports they give of themselves (status). It holds no state of its own: what it
// reads goes into the pool's engines under the pool mutex, which is never held
// while it measures.
type meter struct{ p *Pool }

// footprints measures every runner from outside and the agent itself, stores the
// figures, and returns their sum (the measured pool footprint).
func (m meter) footprints() int64 {
	p := m.p
	type target struct {
		g   *engine
		pid int
	}
	p.mu.Lock()
	targets := make([]target, 0, len(p.engines))
	for g := range p.engines {
		if g.pid > 0 {
			targets = append(targets, target{g, g.pid})
		}
	}
	agentPID := p.cfg.AgentPID
	p.mu.Unlock()

	fps := make([]int64, len(targets))
	ok := make([]bool, len(targets))
	for i, t := range targets {
		if fp, err := p.gauge.Process(t.pid); err == nil {
			fps[i], ok[i] = fp, true
		}
	}
	var agent int64
	if agentPID > 0 {
		if fp, err := p.gauge.Process(agentPID); err == nil {
			agent = fp
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	sum := agent
	for i, t := range targets {
		switch {
		case ok[i]:
			t.g.footprint = fps[i]
			t.g.peak = max(t.g.peak, fps[i])
		case t.g.tearingDown:
			continue // being stopped and gone: its memory is on its way back
		}
		sum += t.g.footprint
	}
	p.agentBytes = agent
	return sum
}

// statuses reads the prompt cache report of every live runner whose model enables
// the cache, and the link report of every split head's.
func (m meter) statuses() {
	p := m.p
	type target struct {
		g    *engine
		name string
		r    Runner
	}
	p.mu.Lock()
	var targets []target
	for g := range p.engines {
		// Engines without a prompt cache are read until they report their chat
		// rendering, which never changes.
		if g.runner != nil && !isClosed(g.stopped) && (g.spec.PromptCache.Enabled || g.chat == nil || len(g.spec.SplitWorkers) > 0) {
			targets = append(targets, target{g, g.name, g.runner})
		}
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, t := range targets {
		p.clock.goCall(&wg, p.cfg.RunnerCallTimeout, "reading the status of "+t.name, func(ctx context.Context) {
			st, err := t.r.Status(ctx)
			if err != nil {
				return
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if st.Chat != nil {
				t.g.chat = st.Chat
			}
			t.g.split = splitStats(&st)
			if st.PromptCache == nil || !t.g.spec.PromptCache.Enabled {
				return
			}
			s := promptCacheStats(st.PromptCache)
			s.Enabled = true
			s.HotShareBytes = t.g.hotShare
			t.g.cache = s
			if e := t.g.entry; e.eng == t.g {
				e.lastCache = s
			}
		})
	}
	wg.Wait()
}

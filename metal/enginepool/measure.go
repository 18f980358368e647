package enginepool

// measurePool measures every runner from outside and the agent itself, stores the
// figures, and returns their sum (the measured pool footprint). No lock is held
// while measuring.
func (p *Pool) measurePool() int64 {
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

package metal

// settle waits for the host gauge to give back what a stopped runner held.
//
// pre is the host's used memory sampled before the runner was stopped and resident
// the runner's footprint; activity is the pool's activity count when pre was taken.
// It samples at once and then every SettleInterval for at
// most SettleTimeout: freed = pre - now; Settled when freed >= resident - tolerance
// (tolerance = max(SettleToleranceBytes, 5% of resident)). If any other entry is
// loading or serving, or started to since pre was taken, the global gauge cannot be attributed to this unload, so it
// stops at once with Indeterminate and the runner's footprint — it never makes
// working engines wait and never reports a negative figure. After the timeout it
// reports TimedOut (with what did come back, floored at zero) and wakes the enforcer.
// It runs in the unload's owner goroutine and holds no lock while waiting.
func (p *Pool) settle(self *entry, activity uint64, pre, resident int64) (SettleOutcome, int64) {
	tolerance := max(p.cfg.SettleToleranceBytes, resident/20)
	deadline := p.clock.Now().Add(p.cfg.SettleTimeout)
	var freed int64
	for {
		if p.othersBusy(self, activity) {
			return Indeterminate, max(resident, 0)
		}
		if hm, err := p.gauge.Host(); err == nil {
			freed = pre - hm.UsedBytes
			if freed >= resident-tolerance {
				return Settled, max(freed, 0)
			}
		}
		left := deadline.Sub(p.clock.Now())
		if left <= 0 {
			p.signal(p.wakeNow)
			return TimedOut, max(freed, 0)
		}
		t := p.clock.NewTimer(min(p.cfg.SettleInterval, left))
		<-t.C()
	}
}

// othersBusy says whether an entry other than self is loading or serving, or has
// loaded or taken a request since the activity count was read.
func (p *Pool) othersBusy(self *entry, activity uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.activity != activity {
		return true
	}
	for _, e := range p.entries {
		if e == self {
			continue
		}
		// A load still in admission has allocated nothing; one that was admitted
		// (it has an engine) is starting or loading a runner.
		if (e.state == StateLoading && e.eng != nil) || e.servingLocked() {
			return true
		}
	}
	return false
}

package enginepool

import "github.com/macfleet/macfleet/metal/enginepool/decide"

// settler is the settle barrier of an unload (ENGINE_POOL.md, step 3): it watches
// the host gauge give back what a stopped runner held, and reads from the pool only
// whether anything else ran meanwhile.
type settler struct{ p *Pool }

// settle waits for the host gauge to give back what a stopped runner held: it
// samples at once and then as decide.Settle says, until it says the barrier is
// done. pre is the host's used memory sampled before the runner was stopped and
// resident the runner's footprint; activity is the pool's activity count when pre
// was taken (anything that loaded or took a request since makes the gauge
// unattributable). A TimedOut barrier wakes the enforcer. It runs in the unload's
// owner goroutine and holds no lock while waiting.
func (st settler) settle(self *entry, activity uint64, pre, resident int64) (SettleOutcome, int64) {
	p := st.p
	name := ""
	if self != nil {
		name = self.spec.Name
	}
	s := decide.SettleSample{Deadline: p.clock.Now().Add(p.cfg.SettleTimeout), Interval: p.cfg.SettleInterval,
		Pre: pre, Resident: resident, ToleranceFloor: p.cfg.SettleToleranceBytes}
	for {
		s.OthersBusy, s.HostOK = st.othersBusy(name, activity), false
		if !s.OthersBusy {
			if hm, err := p.gauge.Host(); err == nil {
				s.Used, s.HostOK = hm.UsedBytes, true
			}
		}
		s.Now = p.clock.Now()
		step := decide.Settle(s)
		if step.Kind == decide.SettleDone {
			if step.Outcome == TimedOut {
				signal(p.wakeNow)
			}
			return step.Outcome, step.Freed
		}
		s.Freed = step.Freed
		t := p.clock.NewTimer(step.Wait)
		<-t.C()
	}
}

// othersBusy says whether an entry other than self is loading or serving, or has
// loaded or taken a request since the activity count was read.
func (st settler) othersBusy(self string, activity uint64) bool {
	p := st.p
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.activity != activity || decide.OthersBusy(p.decideModelsLocked(), self)
}

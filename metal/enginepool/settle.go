package enginepool

import "github.com/macfleet/macfleet/metal/enginepool/decide"

// settle is the settle barrier of an unload (ENGINE_POOL.md, step 3): it waits for
// the host gauge to give back what a stopped runner held, sampling at once and then
// as decide.Settle says, until it says the barrier is done. pre is the host's used
// memory sampled before the runner was stopped and resident the runner's footprint;
// activity is the state's activity count when pre was taken (anything that loaded or
// took a request since makes the gauge unattributable). A TimedOut barrier wakes the
// enforcer. It runs in the unload's owner goroutine and holds no lock while waiting:
// it asks the state only whether anything else ran meanwhile.
func (u unloader) settle(self *entry, activity uint64, pre, resident int64) (SettleOutcome, int64) {
	s := decide.SettleSample{Deadline: u.clock.Now().Add(u.cfg.SettleTimeout), Interval: u.cfg.SettleInterval,
		Pre: pre, Resident: resident, ToleranceFloor: u.cfg.SettleToleranceBytes}
	busy := teardownStep{kind: stepBusy, job: teardownJob{e: self}, activity: activity}
	for {
		s.OthersBusy, s.HostOK = u.st.teardown(busy).busy, false
		if !s.OthersBusy {
			if hm, err := u.gauge.Host(); err == nil {
				s.Used, s.HostOK = hm.UsedBytes, true
			}
		}
		s.Now = u.clock.Now()
		step := decide.Settle(s)
		if step.Kind == decide.SettleDone {
			if step.Outcome == TimedOut {
				signal(u.wake.now)
			}
			return step.Outcome, step.Freed
		}
		s.Freed = step.Freed
		t := u.clock.NewTimer(step.Wait)
		<-t.C()
	}
}

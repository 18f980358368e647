package decide

import (
	"testing"
	"time"
)

// barrier runs the settle barrier against a host gauge given as a function of the
// fake clock, as the pool's executor does, and returns the final step and the time
// it took.
func barrier(t *testing.T, pre, resident int64, host func(elapsed time.Duration) (used int64, ok, busy bool)) (SettleStep, time.Duration) {
	t.Helper()
	now := epoch
	s := SettleSample{Deadline: epoch.Add(5 * time.Second), Interval: 250 * time.Millisecond,
		Pre: pre, Resident: resident, ToleranceFloor: 256 * mib}
	for range 100 {
		s.Now = now
		s.Used, s.HostOK, s.OthersBusy = host(now.Sub(epoch))
		step := Settle(s)
		if step.Kind == SettleDone {
			return step, now.Sub(epoch)
		}
		if step.Wait <= 0 || step.Wait > s.Interval {
			t.Fatalf("wait %s at +%s: want (0, %s]", step.Wait, now.Sub(epoch), s.Interval)
		}
		s.Freed = step.Freed
		now = now.Add(step.Wait)
	}
	t.Fatal("the barrier never ended")
	return SettleStep{}, 0
}

func TestSettle(t *testing.T) {
	const pre = 30 * gib
	gone := func(freed int64) func(time.Duration) (int64, bool, bool) {
		return func(time.Duration) (int64, bool, bool) { return pre - freed, true, false }
	}
	for _, tc := range []struct {
		name      string
		resident  int64
		host      func(time.Duration) (int64, bool, bool)
		want      SettleOutcome
		wantFreed int64
		took      time.Duration
	}{
		{name: "all back", resident: 3 * gib, host: gone(3 * gib), want: Settled, wantFreed: 3 * gib},
		{name: "within the 256 MiB floor", resident: 3 * gib, host: gone(3*gib - 200*mib), want: Settled, wantFreed: 3*gib - 200*mib},
		{name: "within 5% of a large runner", resident: 20 * gib, host: gone(20*gib - 900*mib), want: Settled, wantFreed: 20*gib - 900*mib},
		{name: "outside 5%", resident: 20 * gib, host: gone(20*gib - 1200*mib), want: TimedOut, wantFreed: 20*gib - 1200*mib, took: 5 * time.Second},
		{name: "nothing back", resident: 3 * gib, host: gone(0), want: TimedOut, wantFreed: 0, took: 5 * time.Second},
		{name: "usage grew: never negative", resident: 3 * gib, host: gone(-2 * gib), want: TimedOut, wantFreed: 0, took: 5 * time.Second},
		{name: "comes back after a second", resident: 3 * gib, want: Settled, wantFreed: 3 * gib, took: time.Second,
			host: func(el time.Duration) (int64, bool, bool) {
				if el < time.Second {
					return pre, true, false
				}
				return pre - 3*gib, true, false
			}},
		{name: "another model busy: indeterminate at once, the runner's footprint", resident: 3 * gib, want: Indeterminate, wantFreed: 3 * gib,
			host: func(time.Duration) (int64, bool, bool) { return pre + 5*gib, true, true }},
		{name: "busy later: indeterminate then", resident: 3 * gib, want: Indeterminate, wantFreed: 3 * gib, took: 750 * time.Millisecond,
			host: func(el time.Duration) (int64, bool, bool) { return pre, true, el >= 750*time.Millisecond }},
		{name: "indeterminate never reports a negative footprint", resident: -1, want: Indeterminate, wantFreed: 0,
			host: func(time.Duration) (int64, bool, bool) { return pre, true, true }},
		{name: "gauge errors keep the last good figure", resident: 3 * gib, want: TimedOut, wantFreed: 1 * gib, took: 5 * time.Second,
			host: func(el time.Duration) (int64, bool, bool) {
				if el == 0 {
					return pre - gib, true, false
				}
				return 0, false, false
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			step, took := barrier(t, pre, tc.resident, tc.host)
			if step.Outcome != tc.want || step.Freed != tc.wantFreed || took != tc.took {
				t.Fatalf("settle = %s %d after %s, want %s %d after %s", step.Outcome, step.Freed, took, tc.want, tc.wantFreed, tc.took)
			}
		})
	}
}

// The last wait is cut to the deadline, not a whole interval past it.
func TestSettleWaitEndsAtTheDeadline(t *testing.T) {
	s := SettleSample{Now: epoch.Add(4900 * time.Millisecond), Deadline: epoch.Add(5 * time.Second), Interval: 250 * time.Millisecond,
		Pre: 10 * gib, Used: 10 * gib, HostOK: true, Resident: 3 * gib, ToleranceFloor: 256 * mib}
	if step := Settle(s); step.Kind != SettleWait || step.Wait != 100*time.Millisecond {
		t.Fatalf("Settle = %+v, want a wait of 100ms", step)
	}
}

func TestOthersBusy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		models []Model
		want   bool
	}{
		{name: "alone", models: []Model{with(ready("self", 3, 1), stopping, busy)}},
		{name: "another idle", models: []Model{ready("a", 1, 1)}},
		{name: "another serving", models: []Model{with(ready("a", 1, 1), busy)}, want: true},
		{name: "another draining with a lease", models: []Model{with(ready("a", 1, 1), draining, busy)}, want: true},
		{name: "another loading, admitted", models: []Model{with(ready("a", 1, 1), loading)}, want: true},
		{name: "another still in admission", models: []Model{with(ready("a", 1, 1), unadmitted)}},
		{name: "another stopping", models: []Model{with(ready("a", 1, 1), stopping)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := OthersBusy(tc.models, "self"); got != tc.want {
				t.Fatalf("OthersBusy = %v, want %v", got, tc.want)
			}
		})
	}
}

// Every settle kind is produced, and named.
func TestSettleKindsExhaustive(t *testing.T) {
	produced := map[SettleKind]bool{}
	for _, used := range []int64{10 * gib, 7 * gib} {
		s := SettleSample{Now: epoch, Deadline: epoch.Add(time.Second), Interval: time.Second,
			Pre: 10 * gib, Used: used, HostOK: true, Resident: 3 * gib}
		produced[Settle(s).Kind] = true
	}
	covers(t, SettleKinds, produced)
	distinctNames(t, SettleKinds, "SettleKind(")
}

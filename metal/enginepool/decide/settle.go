package decide

import (
	"fmt"
	"time"
)

// SettleOutcome is how the settle barrier ended.
type SettleOutcome string

const (
	// Settled: the host gauge gave back the runner's footprint (within tolerance).
	Settled SettleOutcome = "Settled"
	// Indeterminate: another engine was loading or serving, so the global gauge could
	// not be attributed to this unload; FreedBytes is the runner's last footprint.
	Indeterminate SettleOutcome = "Indeterminate"
	// TimedOut: the memory did not come back within the settle timeout.
	TimedOut SettleOutcome = "TimedOut"
)

// SettleKind is what the settle barrier does after one sample.
type SettleKind int

const (
	// SettleWait: not settled yet; sample again after Wait.
	SettleWait SettleKind = iota
	// SettleDone: the barrier ends with Outcome and Freed.
	SettleDone
)

// SettleKinds lists every kind, for exhaustive tests.
var SettleKinds = []SettleKind{SettleWait, SettleDone}

func (k SettleKind) String() string {
	switch k {
	case SettleWait:
		return "wait"
	case SettleDone:
		return "done"
	}
	return fmt.Sprintf("SettleKind(%d)", int(k))
}

// SettleSample is one look at the host gauge during one unload's settle barrier.
type SettleSample struct {
	Now, Deadline time.Time
	// Interval is the time between samples.
	Interval time.Duration
	// OthersBusy: another model is loading or serving, or did since Pre was taken.
	OthersBusy bool
	// Pre is the host's used memory sampled before the runner was stopped; Resident
	// the runner's footprint then; ToleranceFloor the minimum tolerance.
	Pre, Resident, ToleranceFloor int64
	// Used is the host's used memory now, if HostOK; Freed what the last good sample
	// gave back.
	Used   int64
	HostOK bool
	Freed  int64
}

// SettleStep is the decision after one sample.
type SettleStep struct {
	Kind    SettleKind
	Outcome SettleOutcome
	// Freed is never negative once Done; while waiting it carries the latest
	// (possibly negative) figure for the next sample.
	Freed int64
	Wait  time.Duration
}

// Settle decides one step of the settle barrier: freed = pre - used; Settled when
// freed >= resident - tolerance (tolerance = max(floor, 5% of resident)). If another
// model is busy, the global gauge cannot be attributed to this unload: Indeterminate
// at once with the runner's footprint — working engines never wait for it. At the
// deadline, TimedOut with what did come back (floored at zero).
func Settle(s SettleSample) SettleStep {
	if s.OthersBusy {
		return SettleStep{Kind: SettleDone, Outcome: Indeterminate, Freed: max(s.Resident, 0)}
	}
	freed := s.Freed
	if s.HostOK {
		freed = s.Pre - s.Used
		if freed >= s.Resident-max(s.ToleranceFloor, s.Resident/20) {
			return SettleStep{Kind: SettleDone, Outcome: Settled, Freed: max(freed, 0)}
		}
	}
	left := s.Deadline.Sub(s.Now)
	if left <= 0 {
		return SettleStep{Kind: SettleDone, Outcome: TimedOut, Freed: max(freed, 0)}
	}
	return SettleStep{Kind: SettleWait, Freed: freed, Wait: min(s.Interval, left)}
}

// OthersBusy says whether a model other than self is loading (admitted, so it
// allocates) or serving.
func OthersBusy(models []Model, self string) bool {
	for i := range models {
		m := &models[i]
		if m.Name == self {
			continue
		}
		if (m.State == StateLoading && m.Engine != nil) || m.Serving() {
			return true
		}
	}
	return false
}

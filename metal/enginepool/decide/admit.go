package decide

import (
	"fmt"
	"slices"
	"strings"
)

// AdmitKind is what admission does next.
type AdmitKind int

const (
	// AdmitMeasure: the gate passed; measure the pool and ask again.
	AdmitMeasure AdmitKind = iota
	// AdmitLoad: commit the reservation and start the runner.
	AdmitLoad
	// AdmitEvict: unload Victim first, then measure and ask again.
	AdmitEvict
	// AdmitWait: unloads in progress will hand back enough; wait for one, then ask again.
	AdmitWait
	// AdmitTooLarge: the model is larger than the ceiling; it can never load.
	AdmitTooLarge
	// AdmitRefuse: not enough memory now (insufficient_memory).
	AdmitRefuse
)

// AdmitKinds lists every kind, for exhaustive tests.
var AdmitKinds = []AdmitKind{AdmitMeasure, AdmitLoad, AdmitEvict, AdmitWait, AdmitTooLarge, AdmitRefuse}

func (k AdmitKind) String() string {
	switch k {
	case AdmitMeasure:
		return "measure"
	case AdmitLoad:
		return "load"
	case AdmitEvict:
		return "evict"
	case AdmitWait:
		return "wait"
	case AdmitTooLarge:
		return "too-large"
	case AdmitRefuse:
		return "refuse"
	}
	return fmt.Sprintf("AdmitKind(%d)", int(k))
}

// AdmitRequest is one admission round of one model.
type AdmitRequest struct {
	Model    string
	Estimate int64
	// Measured is the pool's measured footprint of this round; negative before the
	// first measurement (the gate).
	Measured int64
	// Evicted: an earlier round of this admission started an eviction.
	Evicted bool
}

// Admission is the decision of one round.
type Admission struct {
	Kind AdmitKind
	// Victim is the model to unload (AdmitEvict).
	Victim string
	// Current and Projected (Current + Estimate) are what the round counted, Limit
	// what it compared Projected with; Detail explains a refusal (or a wait that
	// turns into one).
	Current, Projected, Limit int64
	Detail                    string
	// Pending is what unloads in progress will hand back (AdmitWait).
	Pending int64
}

// Admit is the algorithm of ENGINE_POOL.md:
//
//	current   = max(measured pool footprint, committed reservations)
//	projected = current + estimate
//	while projected > soft target and an evictable victim exists: unload it, re-measure
//	admit if projected <= ceiling
//
// Before the first measurement it is the gate: a model larger than the ceiling is
// refused for good, and no load is admitted under hard pressure. After an eviction
// the gauges may still show the victims' residue, so the committed reservations are
// trusted instead. Under soft pressure the limit is the soft watermark. A load that
// does not fit but would once the unloads already under way hand their reservations
// back waits for them rather than being refused.
func Admit(s Snapshot, r AdmitRequest) Admission {
	lim := s.Limits
	if r.Estimate > lim.Ceiling {
		return Admission{Kind: AdmitTooLarge, Limit: lim.Ceiling}
	}
	if r.Measured < 0 {
		if s.Level.AtLeast(PressureHard) {
			current := max(s.Usage, s.Committed)
			return Admission{Kind: AdmitRefuse, Current: current, Projected: current + r.Estimate, Limit: lim.Soft,
				Detail: withBlockers(fmt.Sprintf("loads are paused under %s memory pressure", s.Level), s.Models, r.Model)}
		}
		return Admission{Kind: AdmitMeasure}
	}
	current := max(r.Measured, s.Committed)
	if r.Evicted {
		current = s.Committed
	}
	d := Admission{Current: current, Projected: current + r.Estimate, Limit: lim.Ceiling}
	detail := ""
	if s.Level.AtLeast(PressureSoft) {
		d.Limit = lim.Soft
		detail = fmt.Sprintf("loads are paused above the soft watermark under %s memory pressure", s.Level)
	}
	if d.Projected > lim.Soft {
		if v, ok := Victim(s.Models, r.Model, d.Projected-lim.Soft); ok {
			d.Kind, d.Victim = AdmitEvict, v
			return d
		}
	}
	if d.Projected <= d.Limit {
		d.Kind = AdmitLoad
		return d
	}
	if pending := pendingRelease(s.Models, r.Model); pending > 0 && d.Projected-pending <= d.Limit {
		d.Kind, d.Pending = AdmitWait, pending
	} else {
		d.Kind = AdmitRefuse
	}
	d.Detail = withBlockers(detail, s.Models, r.Model)
	return d
}

// pendingRelease sums the reservations of the running engines being torn down,
// other than self's: what the unloads in progress will hand back.
func pendingRelease(models []Model, self string) int64 {
	var sum int64
	for i := range models {
		m := &models[i]
		if m.Name == self || m.Engine == nil || !m.Engine.Running || !m.Engine.TearingDown {
			continue
		}
		sum += m.Engine.Reservation
	}
	return sum
}

// Blockers names the models that hold memory admission cannot take back now, with
// why: pinned, busy, loading or unloading; sorted.
func Blockers(models []Model, self string) []string {
	var out []string
	for i := range models {
		m := &models[i]
		if m.Name == self || m.Engine == nil {
			continue
		}
		switch {
		case m.State == StateReady && m.Pinned:
			out = append(out, m.Name+" (pinned)")
		case m.State == StateReady && m.Engine.InUse > 0:
			out = append(out, m.Name+" (busy)")
		case m.State == StateLoading:
			out = append(out, m.Name+" (loading)")
		case m.State == StateDraining || m.State == StateStopping:
			out = append(out, m.Name+" (unloading)")
		}
	}
	slices.Sort(out)
	return out
}

func withBlockers(detail string, models []Model, self string) string {
	b := Blockers(models, self)
	if len(b) == 0 {
		return detail
	}
	held := "memory is held by " + strings.Join(b, ", ")
	if detail == "" {
		return held
	}
	return detail + "; " + held
}

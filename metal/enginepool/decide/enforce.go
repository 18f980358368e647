package decide

import (
	"fmt"
	"time"
)

// PressureLevel is the memory enforcer's verdict at one poll.
type PressureLevel string

const (
	// PressureOK: usage below the soft watermark; nothing to do.
	PressureOK PressureLevel = "ok"
	// PressureSoft: at or above soft; loads pause above the soft watermark, idle
	// LRU models are evicted while more than one non-pinned model is loaded.
	PressureSoft PressureLevel = "soft"
	// PressureHard: at or above hard; loads in progress are aborted, idle victims
	// evicted, else the LRU busy model's requests aborted (it stays loaded).
	PressureHard PressureLevel = "hard"
	// PressureEmergency: at or above the ceiling for two polls in a row, or over it
	// by the emergency margin; everything in flight is aborted and non-pinned
	// models unloaded.
	PressureEmergency PressureLevel = "emergency"
)

// Rank orders levels: ok 0, soft 1, hard 2, emergency 3.
func (l PressureLevel) Rank() int {
	switch l {
	case PressureSoft:
		return 1
	case PressureHard:
		return 2
	case PressureEmergency:
		return 3
	}
	return 0
}

// AtLeast says whether l is o or worse.
func (l PressureLevel) AtLeast(o PressureLevel) bool { return l.Rank() >= o.Rank() }

// ClassifyPressure is the level decision. overRun counts consecutive polls at or
// above the ceiling before this one; it returns the level and the new count.
func ClassifyPressure(usage int64, l Limits, emergencyMargin int64, overRun int) (PressureLevel, int) {
	if usage >= l.Ceiling {
		overRun++
	} else {
		overRun = 0
	}
	switch {
	case usage >= l.Ceiling+emergencyMargin || overRun >= 2:
		return PressureEmergency, overRun
	case usage >= l.Hard:
		return PressureHard, overRun
	case usage >= l.Soft:
		return PressureSoft, overRun
	}
	return PressureOK, overRun
}

// ActionKind is one thing the enforcer does to one model.
type ActionKind int

const (
	// UnloadOverCeiling: the model's runner is over its own ceiling by more than
	// 10%; unload it (reason over-ceiling).
	UnloadOverCeiling ActionKind = iota
	// UnloadPressure: unload the model, or cancel its load (reason pressure).
	UnloadPressure
	// AbortRequests: abort the model's requests in flight; it stays loaded.
	AbortRequests
	// UnloadIdle: the model was idle past its idle timeout (reason idle).
	UnloadIdle
)

// ActionKinds lists every kind, for exhaustive tests.
var ActionKinds = []ActionKind{UnloadOverCeiling, UnloadPressure, AbortRequests, UnloadIdle}

func (k ActionKind) String() string {
	switch k {
	case UnloadOverCeiling:
		return "unload-over-ceiling"
	case UnloadPressure:
		return "unload-pressure"
	case AbortRequests:
		return "abort-requests"
	case UnloadIdle:
		return "unload-idle"
	}
	return fmt.Sprintf("ActionKind(%d)", int(k))
}

// Action is one enforcer action on one model.
type Action struct {
	Kind  ActionKind
	Model string
}

// Poll is one enforcer pass's input beyond the snapshot.
type Poll struct {
	// Measured is the usage this poll measured.
	Measured int64
	// OverRun is the count of consecutive polls at or above the ceiling before it.
	OverRun         int
	EmergencyMargin int64
	// HotShrunk: an earlier poll took the prompt cache hot tiers to zero; HotHeld
	// is what they hold now.
	HotShrunk bool
	HotHeld   int64
}

// Enforcement is what one enforcer pass decided.
type Enforcement struct {
	Level   PressureLevel
	OverRun int
	// ShrinkHot: take the hot tiers to zero now (HotReclaim bytes come back);
	// HotShrunk is the state to keep for the next poll.
	ShrinkHot  bool
	HotReclaim int64
	HotShrunk  bool
	// Actions in the order to apply them.
	Actions []Action
}

// Enforce is one enforcer pass at the measured usage (ENGINE_POOL.md, memory
// enforcer): classify, shrink the hot tiers under hard pressure (they cost no
// request and no reload), unload runners over their own ceiling, then act by level
// — emergency: cancel loads, abort everything in flight, unload every non-pinned
// model; hard: cancel loads, evict an idle victim down to the soft watermark
// (counting unloads in progress and the hot tiers' reclaim), else abort the LRU busy
// model's requests; soft: evict the idle LRU model while more than one non-pinned
// model is loaded and nothing is unloading — and finally expire idle models.
func Enforce(s Snapshot, in Poll) Enforcement {
	level, run := ClassifyPressure(in.Measured, s.Limits, in.EmergencyMargin, in.OverRun)
	out := Enforcement{Level: level, OverRun: run, HotShrunk: in.HotShrunk}
	switch {
	case level.AtLeast(PressureHard):
		if !in.HotShrunk {
			out.ShrinkHot, out.HotReclaim = true, in.HotHeld
		}
		out.HotShrunk = true
	case level == PressureOK:
		out.HotShrunk = false
	}
	a := actor{models: s.byName()}
	a.act(level, in.Measured-s.Limits.Soft-out.HotReclaim, s.Now)
	out.Actions = a.actions
	return out
}

// actor emits actions and applies them to its copy of the models, so that later
// steps of the same pass see the models earlier steps unloaded.
type actor struct {
	models  []Model
	actions []Action
	aborted map[string]bool
}

func (a *actor) unload(m *Model, k ActionKind) {
	a.actions = append(a.actions, Action{Kind: k, Model: m.Name})
	if m.State == StateReady {
		m.State = StateDraining
		m.Engine.TearingDown = true
	}
}

func (a *actor) abort(m *Model) {
	if a.aborted[m.Name] {
		return
	}
	if a.aborted == nil {
		a.aborted = map[string]bool{}
	}
	a.aborted[m.Name] = true
	a.actions = append(a.actions, Action{Kind: AbortRequests, Model: m.Name})
}

// act applies level; need is the usage over the soft watermark (less the hot
// tiers' reclaim) before unloads in progress are counted.
func (a *actor) act(level PressureLevel, need int64, now time.Time) {
	pending, nonPinned := int64(0), 0
	for i := range a.models {
		m := &a.models[i]
		if m.Engine != nil && m.Engine.Running && m.Engine.TearingDown {
			pending += m.Engine.Bytes()
		}
		if m.State == StateReady && !m.Pinned {
			nonPinned++
		}
	}
	pending += a.overCeiling()
	switch level {
	case PressureEmergency:
		a.emergency()
	case PressureHard:
		a.hard(need - pending)
	case PressureSoft:
		if pending == 0 && nonPinned > 1 {
			if v, ok := Victim(a.models, "", 0); ok {
				a.unload(a.model(v), UnloadPressure)
			}
		}
	}
	a.expireIdle(now)
}

// overCeiling unloads every Ready runner over its own ceiling (aborting its
// requests first) and returns what they will hand back.
func (a *actor) overCeiling() int64 {
	var freed int64
	for i := range a.models {
		m := &a.models[i]
		g := m.Engine
		if m.State != StateReady || g == nil || g.Reservation <= 0 || g.OverCeiling || g.Footprint <= g.OwnCeiling {
			continue
		}
		g.OverCeiling = true
		if g.InUse > 0 {
			a.abort(m)
		}
		a.unload(m, UnloadOverCeiling)
		freed += g.Bytes()
	}
	return freed
}

func (a *actor) emergency() {
	for i := range a.models {
		m := &a.models[i]
		switch {
		case m.State == StateLoading:
			a.unload(m, UnloadPressure)
		case (m.State == StateReady || m.State == StateDraining) && m.Engine != nil && m.Engine.InUse > 0:
			a.abort(m)
		}
		if m.State == StateReady && !m.Pinned {
			a.unload(m, UnloadPressure)
		}
	}
}

func (a *actor) hard(need int64) {
	for i := range a.models {
		if m := &a.models[i]; m.State == StateLoading {
			a.unload(m, UnloadPressure)
		}
	}
	if need <= 0 {
		return
	}
	if v, ok := Victim(a.models, "", need); ok {
		a.unload(a.model(v), UnloadPressure)
	} else if busy := a.lruBusy(); busy != nil {
		a.abort(busy)
	}
}

// lruBusy is the least recently used Ready model with requests in flight.
func (a *actor) lruBusy() *Model {
	var best *Model
	for i := range a.models {
		m := &a.models[i]
		if m.State != StateReady || m.Engine == nil || m.Engine.InUse == 0 {
			continue
		}
		if best == nil || m.LastUsed.Before(best.LastUsed) ||
			(m.LastUsed.Equal(best.LastUsed) && m.Name < best.Name) {
			best = m
		}
	}
	return best
}

// expireIdle unloads the Ready models without a lease past their idle timeout.
func (a *actor) expireIdle(now time.Time) {
	for i := range a.models {
		m := &a.models[i]
		if m.State != StateReady || m.Engine == nil || m.Engine.InUse > 0 {
			continue
		}
		if m.IdleTimeout > 0 && now.Sub(m.LastUsed) >= m.IdleTimeout {
			a.unload(m, UnloadIdle)
		}
	}
}

func (a *actor) model(name string) *Model {
	for i := range a.models {
		if a.models[i].Name == name {
			return &a.models[i]
		}
	}
	return nil
}

// Intervals are the enforcer's poll intervals.
type Intervals struct {
	// Active while anything loads, serves or unloads or pressure is not ok; Idle
	// with models loaded; Empty without.
	Active, Idle, Empty time.Duration
}

// NextPoll is the adaptive poll interval, shortened to the next idle expiry (at
// least 10 ms away).
func NextPoll(s Snapshot, iv Intervals) time.Duration {
	active := s.Level != PressureOK
	loaded := false
	next := time.Duration(-1)
	for i := range s.Models {
		m := &s.Models[i]
		switch {
		case m.State.Transient():
			active = true
		case m.State == StateReady:
			loaded = true
			if m.Engine != nil && m.Engine.InUse > 0 {
				active = true
			} else if m.IdleTimeout > 0 {
				left := max(m.LastUsed.Add(m.IdleTimeout).Sub(s.Now), 10*time.Millisecond)
				if next < 0 || left < next {
					next = left
				}
			}
		}
	}
	interval := iv.Empty
	switch {
	case active:
		interval = iv.Active
	case loaded:
		interval = iv.Idle
	}
	if next >= 0 && next < interval {
		interval = next
	}
	return interval
}

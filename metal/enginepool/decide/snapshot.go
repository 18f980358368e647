package decide

import (
	"cmp"
	"slices"
	"time"
)

// State is an entry's place in its life cycle:
// Absent → Loading → Ready → Draining → Stopping → Unloaded, and Failed.
type State string

const (
	// StateAbsent: registered, never loaded.
	StateAbsent State = "Absent"
	// StateLoading: admitted (or being admitted), reservation held, runner starting.
	StateLoading State = "Loading"
	// StateReady: serving; accepts leases.
	StateReady State = "Ready"
	// StateDraining: refuses new leases, waits for the ones in flight, then aborts.
	StateDraining State = "Draining"
	// StateStopping: runner being stopped and its memory settling.
	StateStopping State = "Stopping"
	// StateUnloaded: was loaded, now stopped; the next Acquire loads it again.
	StateUnloaded State = "Unloaded"
	// StateFailed: the last load failed or the runner crashed; sticky until the
	// backoff passes, then the next Acquire loads it again.
	StateFailed State = "Failed"
)

// Transient states have an owner goroutine driving them forward under a deadline.
func (s State) Transient() bool {
	return s == StateLoading || s == StateDraining || s == StateStopping
}

// Limits are the pool ceiling and its watermarks, in bytes.
type Limits struct {
	Ceiling, Soft, Hard int64
}

// Engine is one runner lifetime of a model, as the decisions see it.
type Engine struct {
	// Running: the runner process was started (the pool measures it).
	Running bool
	// TearingDown: an owner goroutine is stopping it.
	TearingDown bool
	// InUse is the number of leases held on it.
	InUse int
	// Footprint is its last measured footprint; Reservation what admission committed
	// for it; OwnCeiling the ceiling past which it is a pressure victim.
	Footprint, Reservation, OwnCeiling int64
	// OverCeiling: the enforcer already acted on it being over its own ceiling.
	OverCeiling bool
}

// Bytes is what unloading the engine is expected to free: the larger of its
// measured footprint and its reservation.
func (g *Engine) Bytes() int64 { return max(g.Footprint, g.Reservation) }

// Model is one registered model.
type Model struct {
	Name  string
	State State
	// Pinned models are never evicted by LRU, idle expiry or soft pressure.
	Pinned bool
	// IdleTimeout unloads the model once idle that long; zero never.
	IdleTimeout time.Duration
	LastUsed    time.Time
	// Engine is the current engine (Loading with a reservation, Ready, Draining,
	// Stopping); nil when the model holds no memory.
	Engine *Engine
}

// Serving says whether m has work in flight on a live engine.
func (m *Model) Serving() bool {
	return m.Engine != nil && m.Engine.InUse > 0 && (m.State == StateReady || m.State == StateDraining)
}

// Snapshot is the pool at one instant: everything a decision reads.
type Snapshot struct {
	Now    time.Time
	Limits Limits
	// Level is the enforcer's level at its last poll; Usage what it measured then.
	Level PressureLevel
	Usage int64
	// Committed is the sum of the reservations held.
	Committed int64
	// Models, in any order; decisions visit them by name.
	Models []Model
}

// byName returns the snapshot's models sorted by name (a copy: decisions that
// simulate their own actions change it).
func (s *Snapshot) byName() []Model {
	ms := slices.Clone(s.Models)
	for i := range ms {
		if ms[i].Engine != nil {
			g := *ms[i].Engine
			ms[i].Engine = &g
		}
	}
	slices.SortFunc(ms, func(a, b Model) int { return cmp.Compare(a.Name, b.Name) })
	return ms
}

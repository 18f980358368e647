package enginepool

import (
	"context"
	"slices"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// State is an entry's place in its life cycle:
// Absent → Loading → Ready → Draining → Stopping → Unloaded, and Failed.
// The pool's decisions (package decide) read it.
type State = decide.State

const (
	StateAbsent   = decide.StateAbsent
	StateLoading  = decide.StateLoading
	StateReady    = decide.StateReady
	StateDraining = decide.StateDraining
	StateStopping = decide.StateStopping
	StateUnloaded = decide.StateUnloaded
	StateFailed   = decide.StateFailed
)

// UnloadReason says why an engine was stopped.
type UnloadReason string

const (
	ReasonAdmin       UnloadReason = "admin"
	ReasonIdle        UnloadReason = "idle"
	ReasonEviction    UnloadReason = "eviction"     // admission made room for another model
	ReasonPressure    UnloadReason = "pressure"     // the memory enforcer
	ReasonOverCeiling UnloadReason = "over-ceiling" // runner exceeded its own ceiling by >10%
	ReasonRemoved     UnloadReason = "removed"      // the model left the configuration
	ReasonShutdown    UnloadReason = "shutdown"
	ReasonCrash       UnloadReason = "crash"
	ReasonLoadFailed  UnloadReason = "load-failed"
	ReasonLoadAborted UnloadReason = "load-aborted"
	ReasonRetired     UnloadReason = "retired" // Retire: the model serves no more, its entry stays
)

// SettleOutcome is how the settle barrier ended (decide.Settle).
type SettleOutcome = decide.SettleOutcome

const (
	Settled       = decide.Settled
	Indeterminate = decide.Indeterminate
	TimedOut      = decide.TimedOut
)

// UnloadReport is what one unload gave back.
type UnloadReport struct {
	Reason UnloadReason `json:"reason"`
	// FreedBytes is never negative. Settled/TimedOut: the drop of the host gauge;
	// Indeterminate: the runner's last measured footprint.
	FreedBytes int64 `json:"freedBytes"`
	// ResidentBytes is the runner's footprint measured just before it was stopped.
	ResidentBytes int64         `json:"residentBytes"`
	Outcome       SettleOutcome `json:"outcome"`
	// Duration runs from the start of the drain to the end of the settle.
	Duration time.Duration `json:"duration"`
	Time     time.Time     `json:"time"`
	// Aborted is the number of in-flight generations the drain had to abort.
	Aborted int `json:"aborted,omitempty"`
	// DeviceFreedBytes is, on a machine whose accelerators have memory of their own,
	// how far the cards' used memory fell while the runner stopped, as their driver
	// reports it (Config.DeviceGauge); absent on a Mac, where FreedBytes holds it.
	DeviceFreedBytes int64 `json:"deviceFreedBytes,omitempty"`
}

// entry is one registered model. Every field is guarded by the state's lock.
type entry struct {
	// spec is the desired spec, used by the next load. A loaded engine keeps the spec
	// it was started with (engine.spec), so a config reload never replaces it.
	spec  ModelSpec
	state State
	// eng is the engine of the current load (Loading with a reservation, Ready,
	// Draining, Stopping); nil otherwise.
	eng *engine
	// attempt is the load in progress while Loading.
	attempt *loadAttempt
	// transition is closed when the entry next reaches a stable state; nil while stable.
	transition chan struct{}

	lastUsed   time.Time
	failures   int
	failReason string
	retryAt    time.Time
	lastErr    error
	lastUnload *UnloadReport
	// lastCache is the latest prompt cache report of the entry's engines; it outlives
	// the engine so counters do not vanish on unload.
	lastCache *PromptCacheStats
	// lastOff is the paths the entry's latest runner to report serves the model
	// without (runnerapi.Status.Off); like lastCache it outlives the engine.
	lastOff []runnerapi.PathOff
	// removed entries are deleted once their engine has stopped.
	removed bool
	// retired entries refuse every lease and load (Retire) until they are removed.
	retired bool
}

// loadAttempt is one load; waiters block on done and then read err.
type loadAttempt struct {
	done   chan struct{}
	err    error
	cancel context.CancelCauseFunc
	// cancelReason is set when someone (unload, pressure, shutdown) cancels the load.
	cancelReason UnloadReason
	cancelErr    error
	started      time.Time
}

// engine is one runner lifetime. Leases point at an engine, not at the entry, so
// counters of a stopped engine can never leak into the next one. Fields are guarded
// by the state's lock except where noted.
type engine struct {
	entry *entry
	name  string
	gen   uint64
	// spec is what the runner was started with (immutable).
	spec ModelSpec
	// reservation is held in state.committed from admission until after settle;
	// startCeiling is the ceiling its runner starts with, runnerCeiling(reservation).
	reservation, startCeiling int64
	// runner, pid are set once the factory returned, before any lease exists.
	runner Runner
	pid    int

	inUse int
	// The integral of inUse over time since loadedAt (ModelSnapshot.LeaseSeconds),
	// kept in two sums that cost one subtraction a lease: heldNanos, the time the
	// released leases were held; activeNanos, the sum of the active leases' acquire
	// times as offsets from loadedAt (see leaseSecondsAt).
	heldNanos, activeNanos int64
	// released is closed when inUse reaches zero while the drain waits for it.
	released chan struct{}
	// stopped is closed when the engine is invalidated (stopping or crashed); stopErr
	// (written before the close) says why.
	stopped chan struct{}
	stopErr error
	// tearingDown marks that an owner goroutine is stopping this engine.
	tearingDown bool

	footprint      int64
	peak           int64
	activeReported int
	requests       int64
	loadedAt       time.Time
	// overCeilingSince guards against acting twice on one over-ceiling runner.
	overCeiling bool

	// hotShare is the share of the agent's hot budget the pool decided for the
	// runner; hotBudget the budget the runner last confirmed (-1: not known yet).
	hotShare, hotBudget int64
	// cache is the runner's last prompt cache report.
	cache *PromptCacheStats
	// chat is how the runner renders chat prompts (nil until it reported).
	chat *runnerapi.ChatInfo
	// split is a split head runner's last report of its links (nil: not split).
	split *SplitStats
	// off is the paths the runner last reported it serves the model without.
	off []runnerapi.PathOff
	// runtimeBytes is the host memory of an accelerator runtime whose device has
	// memory of its own (a discrete card): the runner's footprint when it became
	// Ready, its model on the card (0 on a Mac and on the CPU). See hostCeiling.
	runtimeBytes int64
}

// cacheOff says whether the runner reported that it serves the model without its
// prompt cache: it gets no hot share and is never told a budget.
func (g *engine) cacheOff() bool {
	return slices.ContainsFunc(g.off, func(o runnerapi.PathOff) bool { return o.Path == runnerapi.PathPromptCache })
}

// leaseSecondsAt is the integral of inUse over time from loadedAt to now: the time
// the released leases were held, plus, for each active one, now less its acquire time.
// In floating point: inUse × the engine's age would overflow int64 nanoseconds
// after about three years at a hundred leases.
func (g *engine) leaseSecondsAt(now time.Time) float64 {
	active := float64(g.inUse)*float64(now.Sub(g.loadedAt)) - float64(g.activeNanos)
	return (float64(g.heldNanos) + max(active, 0)) / float64(time.Second)
}

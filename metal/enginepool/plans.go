package enginepool

import (
	"context"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// The values that cross the state's lock: what a view reads (query, view), a
// request's route, and the steps of loads, teardowns and measurements that the
// owner goroutines and the meter hand to the state to apply, with what each step
// leaves them to do outside the lock.

// query says what a view reads besides the limits.
type query struct {
	// model (a name or alias) or entry: the entry to read.
	model string
	entry *entry
	// decide asks for a decide.Snapshot; runners for the live runners.
	decide, runners bool
}

// view is what the small reads need, read under one lock.
type view struct {
	ceiling   Ceiling
	level     PressureLevel
	usage     int64
	lastPoll  time.Time
	activity  uint64
	agentPID  int
	snap      decide.Snapshot
	runners   []runnerRef
	hotBudget int64 // as configured
	// The asked entry: found (and not removed), its spec (the loaded engine's when
	// it has one), its Ready runner, its last unload and its load's cancel error.
	found, known bool
	name         string
	spec         ModelSpec
	state        State
	runner       Runner
	lastUnload   *UnloadReport
	cancelErr    error
}

// runnerRef is one live runner, for the calls made to every runner.
type runnerRef struct {
	g    *engine
	name string
	r    Runner
	pid  int
	// status: the poll reads its status (a prompt cache, a split head, or a chat
	// rendering not yet known).
	status bool
}

// routed is a request's route: a lease, or the load attempt to wait for (with the
// load to hand to its owner when the route began it), or the refusal.
type routed struct {
	lease   *Lease
	attempt *loadAttempt
	load    *loadJob
	err     error
}

// loadJob is one load that route began: its context (canceled by an unload or
// pressure, and at LoadTimeout), its entry and attempt, the spec it loads and the
// state to go back to when it is refused.
type loadJob struct {
	ctx     context.Context
	entry   *entry
	attempt *loadAttempt
	spec    ModelSpec
	prev    State
	gen     uint64
}

// admitRound is one round of an admission: the job, what the rounds so far did
// (req), and the admission's context, ended when the load is canceled.
type admitRound struct {
	ctx context.Context
	job loadJob
	req decide.AdmitRequest
}

// admitted is one admission round's outcome: the engine admitted (its reservation
// committed), or a victim (its teardown to start) and a channel to wait on before
// the next round, or the refusal; all nil: measure and ask again.
type admitted struct {
	eng                  *engine
	victim               string
	evict                []teardownJob
	wait                 <-chan struct{}
	err                  error
	projected, softBytes int64
}

// loadStepKind names a step of a load.
type loadStepKind int

const (
	// loadStarted: the factory started the runner (not yet ready).
	loadStarted loadStepKind = iota
	// loadEnded: the runner is ready (err nil) or did not come up.
	loadEnded
	// loadRefused: admission refused, or the load was canceled before it had a
	// reservation.
	loadRefused
)

// loadStep is a step of a load to apply: what the process work gave back.
type loadStep struct {
	kind      loadStepKind
	job       loadJob
	eng       *engine
	runner    Runner
	footprint int64
	// deviceSeparate: the Ready runner reported its model's memory on a device
	// with memory of its own (runnerapi.Status.DeviceMemorySeparate).
	deviceSeparate bool
	err            error
	// cause is the load context's cause, for the message of a failed start.
	cause error
}

// loadApplied is what a load step leaves the owner to do: watch a Ready runner, or
// tear down a failed one; tell the observers; err is the load's error.
type loadApplied struct {
	ready     bool
	teardown  *teardownJob
	err       error
	observers []Observer
}

// teardownJob is one engine to take down, handed over by the state (beginUnload, a
// failed load, a crash) to the unloader.
type teardownJob struct {
	e    *entry
	g    *engine
	plan teardownPlan
}

// teardownPlan says how one engine is taken down.
type teardownPlan struct {
	reason UnloadReason
	// final is StateUnloaded or StateFailed.
	final State
	// cause is the failure behind a Failed final state.
	cause error
	// drain is the graceful wait for leases before aborting; zero aborts at once.
	drain time.Duration
	// crashed: the process is already gone, so there is nothing to abort and the
	// host gauge cannot show this unload.
	crashed bool
}

// teardownStepKind names a step of a teardown.
type teardownStepKind int

const (
	// stepAwait: are the leases gone? If not, the channel to wait on.
	stepAwait teardownStepKind = iota
	// stepStop: Stopping; the handles invalidated and the counters reset before the
	// runner is stopped.
	stepStop
	// stepRelease: the reservation back, the report kept and counted, the final state.
	stepRelease
	// stepCrash: the runner exited on its own; Stopping unless someone already owns it.
	stepCrash
	// stepBusy: is anything else loading or serving, or has anything run since the
	// activity count (the settle barrier's bail-out)?
	stepBusy
)

// teardownStep is a step of a teardown to apply.
type teardownStep struct {
	kind    teardownStepKind
	job     teardownJob
	report  *UnloadReport
	aborted int
	start   time.Time
	// activity is the count stepBusy compares.
	activity uint64
}

// tornDown is what a teardown step read or leaves to do.
type tornDown struct {
	released <-chan struct{}
	// What stepStop read: the runner to stop, its pid and last footprint, and the
	// activity count at that moment.
	runner    Runner
	pid       int
	resident  int64
	activity  uint64
	crashed   bool
	busy      bool
	observers []Observer
}

// measurementKind names what a measurement is.
type measurementKind int

const (
	measuredFootprints measurementKind = iota
	measuredStatus
	measuredBudget
)

// measurement is what a measurement or a runner call gave back, to record.
type measurement struct {
	kind measurementKind
	// measuredFootprints: each runner's footprint and the agent's.
	footprints []footprint
	agent      int64
	// measuredStatus and measuredBudget: one runner's own report (its chat
	// rendering, its links, the paths it serves the model without, its prompt
	// cache: nil when it has none or its model disables the cache), or the hot
	// budget it confirmed.
	g         *engine
	chat      *runnerapi.ChatInfo
	split     *SplitStats
	cache     *PromptCacheStats
	off       []runnerapi.PathOff
	hotBudget int64
}

// footprint is one runner's footprint as measured (ok: the gauge answered).
type footprint struct {
	g     *engine
	bytes int64
	ok    bool
}

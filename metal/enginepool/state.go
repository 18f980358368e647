package enginepool

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// state is the pool's shared state and the one owner of its mutex: every field
// below mu, the entries and their engines are guarded by it and touched only by
// state's methods. Each of its ten entry points takes the lock once, reads a view or
// applies a plan (most of them one that package decide returned), and returns what
// the caller must do outside the lock — start or stop a process, wait, measure, tell
// the observers. The helpers they call with the lock held (state's other methods, the
// entry and engine helpers) never do I/O and never wait.
//
// Its methods live with the flow that takes them (plans.go holds the plans' types):
//
//	route     a request: decide.RouteRequest, then a lease, a join or a new load (load.go)
//	view      the small reads: one model, the limits, the runners, a decide.Snapshot (load.go)
//	admit     one admission round: decide.Admit, then commit, evict, wait or refuse (load.go)
//	load      a load's steps: its runner started, then Ready, Failed or refused (load.go)
//	teardown  an unload's steps: drain, stop, settle's bail-out, release; a crash (unload.go)
//	release   a lease's end (lease.go)
//	record    what a measurement or a runner call gave back (measure.go)
//	change    registration, admin unloads, the ceiling, observers, Close and Detach (registry.go)
//	enforce   one enforcer verdict: decide.Enforce, the hot shares, the limits (enforcer.go)
//	snapshot  the public Snapshot (snapshot.go)
type state struct {
	// Set by newState and never changed.
	cfg   Config
	hw    Hardware
	clock ownerClock
	// wake is the enforcer's: loads, unloads and a request on an idle engine wake it.
	wake wakes
	// base is the parent of every load's context; Close and Detach cancel it.
	base context.Context

	mu        sync.Mutex
	ceiling   Ceiling
	entries   map[string]*entry
	aliases   map[string]string
	engines   map[*engine]struct{} // every engine with a runner not yet reaped
	observers []Observer
	closed    bool
	gen       uint64
	committed int64
	// activity counts load starts, loads finished and leases taken; the settle
	// barrier compares it to see whether anything else ran since its pre sample.
	activity uint64
	// The enforcer's last poll.
	usage          int64
	agentBytes     int64
	level          PressureLevel
	overCeilingRun int
	lastPoll       time.Time
	// hotShrunk: hard pressure took every hot tier to zero; they stay there until
	// pressure is ok again.
	hotShrunk bool
	// Counters.
	loads, loadFailures, crashes, unloads, evictions int64
	freedTotal                                       int64
}

// deps is what every effect of the pool works with besides the state: the config,
// the injected clock, the log, the memory gauge and the enforcer's wake channels.
type deps struct {
	cfg   Config
	clock ownerClock
	log   logr.Logger
	gauge Gauge
	wake  wakes
}

// wakes are the enforcer's wake channels: now asks for a poll at once, active for
// one within PollActive (a request started).
type wakes struct {
	now, active chan struct{}
}

// Package decide holds the engine pool's decisions as pure functions: a Snapshot of
// the pool (and a request) in, a decision value out. No locks, no I/O, no clock:
// the time comes in the snapshot. The pool in package enginepool is their executor: it
// holds its mutex, takes the snapshot, calls the decision and applies it (starts and
// stops runners, moves entries between states, records metrics).
//
//   - RouteRequest: whether a request leases a Ready engine, joins the load under way,
//     starts a load or is refused (route.go).
//   - Admit: whether a model loads now, what must be evicted first, whether the load
//     waits for unloads in progress or is refused (admit.go).
//   - SelectVictim and Candidates: which idle model an eviction unloads (victims.go).
//   - Enforce and ClassifyPressure: what the memory enforcer does at one measured
//     usage; NextPoll: when it polls again (enforce.go).
//   - Settle: whether an unload's memory has come back, and when to look again
//     (settle.go).
//
// The package is named for what it holds: every "should the pool do X now?" of
// ENGINE_POOL.md is answered here, and only here.
package decide

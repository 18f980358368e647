package decide

import (
	"fmt"
	"time"
)

// RouteKind is what a request for a model does next.
type RouteKind int

const (
	// RouteLease: the model is Ready; lease its engine.
	RouteLease RouteKind = iota
	// RouteJoin: a load is under way; wait for it.
	RouteJoin
	// RouteLoad: nothing serves the model and nothing keeps it from loading; start a
	// load and wait for it.
	RouteLoad
	// RouteRefuse: answer now (Refusal says why).
	RouteRefuse
)

// RouteKinds lists every kind, for exhaustive tests.
var RouteKinds = []RouteKind{RouteLease, RouteJoin, RouteLoad, RouteRefuse}

func (k RouteKind) String() string {
	switch k {
	case RouteLease:
		return "lease"
	case RouteJoin:
		return "join"
	case RouteLoad:
		return "load"
	case RouteRefuse:
		return "refuse"
	}
	return fmt.Sprintf("RouteKind(%d)", int(k))
}

// Refusal is why a request is refused (RouteRefuse).
type Refusal int

const (
	// RefuseNone: the request is not refused.
	RefuseNone Refusal = iota
	// RefuseClosed: the pool is shutting down.
	RefuseClosed
	// RefuseUnknown: no such model (or it was removed).
	RefuseUnknown
	// RefuseRetired: the model is being removed from this node (Retire).
	RefuseRetired
	// RefuseDraining: the model is being unloaded (Draining or Stopping).
	RefuseDraining
	// RefuseBackoff: the last load failed and its backoff has not passed.
	RefuseBackoff
)

func (r Refusal) String() string {
	switch r {
	case RefuseNone:
		return "none"
	case RefuseClosed:
		return "closed"
	case RefuseUnknown:
		return "unknown"
	case RefuseRetired:
		return "retired"
	case RefuseDraining:
		return "draining"
	case RefuseBackoff:
		return "backoff"
	}
	return fmt.Sprintf("Refusal(%d)", int(r))
}

// RouteInput is what routing one request reads: the pool's state and the requested
// entry's.
type RouteInput struct {
	Now time.Time
	// Closed: the pool refuses new leases.
	Closed bool
	// Known: the name or alias resolves to an entry that was not removed.
	Known bool
	// Retired: the entry serves no more (Retire).
	Retired bool
	State   State
	// RetryAt is when a Failed entry may load again.
	RetryAt time.Time
}

// Route is the decision for one request.
type Route struct {
	Kind    RouteKind
	Refusal Refusal
	// Retry is how long until a load may be tried again (RefuseBackoff).
	Retry time.Duration
}

// RouteRequest decides what a request for a model does: lease a Ready engine, join
// the load under way, start a load, or be refused. A Failed model loads again once
// its backoff has passed; an Absent or Unloaded one loads at once.
func RouteRequest(in RouteInput) Route {
	refuse := func(r Refusal) Route { return Route{Kind: RouteRefuse, Refusal: r} }
	switch {
	case in.Closed:
		return refuse(RefuseClosed)
	case !in.Known:
		return refuse(RefuseUnknown)
	case in.Retired:
		// The same answer as while draining: a gateway retries elsewhere.
		return refuse(RefuseRetired)
	}
	switch in.State {
	case StateReady:
		return Route{Kind: RouteLease}
	case StateLoading:
		return Route{Kind: RouteJoin}
	case StateDraining, StateStopping:
		return refuse(RefuseDraining)
	case StateFailed:
		if in.Now.Before(in.RetryAt) {
			return Route{Kind: RouteRefuse, Refusal: RefuseBackoff, Retry: in.RetryAt.Sub(in.Now)}
		}
	}
	return Route{Kind: RouteLoad}
}

package clustermode

import "fmt"

// Desired is what the API asks of one replica on this node.
type Desired int

const (
	// DesiredAbsent: the replica is deleted, being deleted, or no longer bound here.
	DesiredAbsent Desired = iota
	// DesiredResident: loaded eagerly, may be evicted under pressure.
	DesiredResident
	// DesiredPinned: loaded eagerly, never evicted.
	DesiredPinned
	// DesiredOnDemand: downloaded and registered; loaded by the first request.
	DesiredOnDemand
	// DesiredChanged: the replica's template (hash) or identity differs from the one
	// this node acted on.
	DesiredChanged
	// DesiredDrained: the deployment controller is removing the replica (spec.drain):
	// unloaded after its in-flight requests, never loaded again, its status still
	// reported until the replica is deleted.
	DesiredDrained
	numDesired
)

var desiredNames = [...]string{"Absent", "Resident", "Pinned", "OnDemand", "Changed", "Drained"}

func (d Desired) String() string {
	if d >= 0 && d < numDesired {
		return desiredNames[d]
	}
	return fmt.Sprintf("Desired(%d)", int(d))
}

// Observed is this node's local state of one replica: the download, then the pool entry.
type Observed int

const (
	// ObservedNotRegistered: nothing is known locally.
	ObservedNotRegistered Observed = iota
	// ObservedDownloading: the store is fetching the model.
	ObservedDownloading
	// ObservedDownloadFailed: the last fetch failed; it is retried after a backoff.
	ObservedDownloadFailed
	// ObservedDownloaded: the model is in the store but not in the pool.
	ObservedDownloaded
	// ObservedStandby: registered in the pool, not loaded (never, or unloaded since).
	ObservedStandby
	// ObservedLoading: a runner is starting.
	ObservedLoading
	// ObservedLoaded: a runner serves the model.
	ObservedLoaded
	// ObservedLoadFailed: the last load failed or the runner crashed (pool backoff).
	ObservedLoadFailed
	// ObservedUnloading: the engine is draining or stopping.
	ObservedUnloading
	numObserved
)

var observedNames = [...]string{"NotRegistered", "Downloading", "DownloadFailed", "Downloaded", "Standby",
	"Loading", "Loaded", "LoadFailed", "Unloading"}

func (o Observed) String() string {
	if o >= 0 && o < numObserved {
		return observedNames[o]
	}
	return fmt.Sprintf("Observed(%d)", int(o))
}

// Action is what the agent does to move a replica from observed towards desired.
type Action int

const (
	// actionUndefined marks a missing table cell; Decide never returns it for valid input.
	actionUndefined Action = iota
	// ActionNone: nothing to do now (in progress, or already as desired).
	ActionNone
	// ActionFetch: start downloading the model into the store.
	ActionFetch
	// ActionRetryFetch: fetch again once the download backoff has passed.
	ActionRetryFetch
	// ActionRegisterLoad: add the model to the pool and load it.
	ActionRegisterLoad
	// ActionRegister: add the model to the pool without loading it (OnDemand).
	ActionRegister
	// ActionLoad: load a registered model that is not in memory.
	ActionLoad
	// ActionRetryLoad: load again once the pool's failure backoff has passed.
	ActionRetryLoad
	// ActionUpdate: apply a changed template: residency, idle timeout and names at
	// once; engine settings by reloading; a different file by starting over.
	ActionUpdate
	// ActionRemove: cancel the download, drain and unload the engine, and remove the
	// model from the pool.
	ActionRemove
	// ActionRetire: retire the pool entry (enginepool.Pool.Retire): it refuses requests with
	// the pool's draining 503, its engine is drained and unloaded, and it stays
	// registered, unloaded, so that the unload's report reaches the replica's status.
	ActionRetire
	numActions
)

var actionNames = [...]string{"Undefined", "None", "Fetch", "RetryFetch", "RegisterLoad", "Register", "Load",
	"RetryLoad", "Update", "Remove", "Retire"}

func (a Action) String() string {
	if a >= 0 && a < numActions {
		return actionNames[a]
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// transitions is the agent's whole behaviour per replica: rows are the observed local
// state, columns the desired state. A Drained replica is never fetched or loaded: a
// download in progress is canceled, one not in the pool is left as it is, and a pool
// entry in any state is retired (idempotent).
var transitions = [numObserved][numDesired]Action{
	//                       Absent        Resident            Pinned              OnDemand        Changed   Drained
	ObservedNotRegistered:  {ActionNone, ActionFetch, ActionFetch, ActionFetch, ActionFetch, ActionNone},
	ObservedDownloading:    {ActionRemove, ActionNone, ActionNone, ActionNone, ActionRemove, ActionRemove},
	ObservedDownloadFailed: {ActionRemove, ActionRetryFetch, ActionRetryFetch, ActionRetryFetch, ActionRemove, ActionNone},
	ObservedDownloaded:     {ActionRemove, ActionRegisterLoad, ActionRegisterLoad, ActionRegister, ActionRemove, ActionNone},
	ObservedStandby:        {ActionRemove, ActionLoad, ActionLoad, ActionNone, ActionUpdate, ActionRetire},
	ObservedLoading:        {ActionRemove, ActionNone, ActionNone, ActionNone, ActionUpdate, ActionRetire},
	ObservedLoaded:         {ActionRemove, ActionNone, ActionNone, ActionNone, ActionUpdate, ActionRetire},
	// OnDemand: the next request retries (the pool answers 503 during its backoff; the
	// replica is Ready again when the backoff ends, see ownedStatus).
	ObservedLoadFailed: {ActionRemove, ActionRetryLoad, ActionRetryLoad, ActionNone, ActionUpdate, ActionRetire},
	// Removal of an entry that is already stopping only marks it removed.
	ObservedUnloading: {ActionRemove, ActionNone, ActionNone, ActionNone, ActionUpdate, ActionRetire},
}

// Decide is the action for one (desired, observed) pair.
func Decide(d Desired, o Observed) Action {
	if d < 0 || d >= numDesired || o < 0 || o >= numObserved {
		return actionUndefined
	}
	return transitions[o][d]
}

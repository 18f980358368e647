package modeldeployment

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// DefaultDrainTimeout is how long the controller waits, after setting a replica's
// spec.drain, for its agent to report the model unloaded before it deletes the
// replica anyway. It covers the pool's graceful drain of in-flight requests, the
// runner's stop and the settle wait of the unload measurement, with room to spare.
const DefaultDrainTimeout = 2 * time.Minute

// removalAction is what the controller does with a replica it is removing.
type removalAction int

const (
	// removalWait: the replica drains; look again after removal.Wait.
	removalWait removalAction = iota
	// removalDrain: set spec.drain; the agent unloads the model and reports it.
	removalDrain
	// removalDelete: delete the replica now.
	removalDelete
)

func (a removalAction) String() string {
	switch a {
	case removalWait:
		return "Wait"
	case removalDrain:
		return "Drain"
	case removalDelete:
		return "Delete"
	}
	return fmt.Sprintf("removalAction(%d)", int(a))
}

// Why a replica being removed is deleted.
const (
	removedUnbound   = "unbound"
	removedNodeDown  = "node not ready"
	removedNotLoaded = "not loaded"
	removedDrained   = "drained"
	removedTimedOut  = "drain timed out"
)

// removal is the decision for one replica being removed.
type removal struct {
	Action removalAction
	// Why says why the replica is deleted (removalDelete).
	Why string
	// Wait is how long the drain may still take (removalWait).
	Wait time.Duration
}

// decideRemoval decides the next step of removing mr, a replica plan chose to
// delete or one already draining. nodeReady says whether its MacNode exists and is
// Ready. A replica whose model is in memory on a Ready Mac is drained first (the
// gateway stops routing to it, the agent finishes its requests, unloads the model and
// reports what the unload freed); every other one is deleted at once, since there is
// nothing to drain or no one to drain it. A draining replica is deleted once its
// agent reports the model unloaded, its Mac stops being Ready, or timeout has passed
// since its drain began.
func decideRemoval(mr *v1alpha1.ModelReplica, nodeReady bool, now time.Time, timeout time.Duration) removal {
	deleteFor := func(why string) removal { return removal{Action: removalDelete, Why: why} }
	switch {
	case mr.Spec.Drain == nil && mr.Spec.NodeName == "":
		return deleteFor(removedUnbound)
	case mr.Spec.Drain == nil && !nodeReady:
		return deleteFor(removedNodeDown)
	case mr.Spec.Drain == nil && !meta.IsStatusConditionTrue(mr.Status.Conditions, v1alpha1.ReplicaLoaded):
		return deleteFor(removedNotLoaded)
	case mr.Spec.Drain == nil:
		return removal{Action: removalDrain}
	case drained(mr):
		return deleteFor(removedDrained)
	case mr.Spec.NodeName == "" || !nodeReady:
		return deleteFor(removedNodeDown)
	}
	left := timeout - now.Sub(mr.Spec.Drain.Time)
	if left <= 0 {
		return deleteFor(removedTimedOut)
	}
	return removal{Action: removalWait, Wait: left}
}

// drained says whether the agents report mr's model unloaded for its drain: the
// agent of its Mac says so in its Loaded condition, written for the current spec (the
// one with spec.drain set), and, for a split replica, every worker shard's Mac has
// reported its own shard's unload (shardsUnloaded).
func drained(mr *v1alpha1.ModelReplica) bool {
	return mr.DrainReported() && shardsUnloaded(mr)
}

// shardsUnloaded says whether every worker shard of mr's split reports an unload
// since the drain began (its entry's lastUnload), or a failed shard with nothing in
// memory; true for a replica that is not split. A worker's Mac unloads its shard once
// the head reports its runner unloaded.
func shardsUnloaded(mr *v1alpha1.ModelReplica) bool {
	for _, node := range mr.Spec.Split.WorkerNodes() {
		e := mr.ShardEntry(node)
		if e == nil || (e.Phase != v1alpha1.ReplicaFailed && !e.LastUnload.UnloadedSince(mr.Spec.Drain)) {
			return false
		}
	}
	return true
}

// drainUnload is the unload the agent recorded for mr's drain: status.lastUnload when
// it finished at or after the drain began (lastUnload has one-second resolution),
// nil otherwise.
func drainUnload(mr *v1alpha1.ModelReplica) *v1alpha1.UnloadReport {
	if u := mr.Status.LastUnload; u.UnloadedSince(mr.Spec.Drain) {
		return u
	}
	return nil
}

// removedNote is the deployment Event's message for a draining replica deleted for
// why.
func removedNote(mr *v1alpha1.ModelReplica, why string, timeout time.Duration) string {
	switch why {
	case removedDrained:
		if u := drainUnload(mr); u != nil {
			return fmt.Sprintf("Replica %s drained and unloaded on %s, freed %s", mr.Name, mr.Spec.NodeName,
				mebibytes(u.FreedBytes)) + shardsFreedNote(mr)
		}
		return fmt.Sprintf("Replica %s drained on %s (its model was not in memory)", mr.Name, mr.Spec.NodeName) +
			shardsFreedNote(mr)
	case removedTimedOut:
		return fmt.Sprintf("Replica %s deleted: its agent on %s did not report the model unloaded within %s", mr.Name,
			mr.Spec.NodeName, timeout)
	}
	return fmt.Sprintf("Replica %s deleted while draining: its Mac %s is not Ready", mr.Name, mr.Spec.NodeName)
}

// shardsFreedNote is what each worker shard's Mac freed at the drain of a split
// replica, for removedNote ("" for a replica that is not split).
func shardsFreedNote(mr *v1alpha1.ModelReplica) string {
	var parts []string
	for _, node := range mr.Spec.Split.WorkerNodes() {
		if e := mr.ShardEntry(node); e != nil && e.LastUnload.UnloadedSince(mr.Spec.Drain) {
			parts = append(parts, fmt.Sprintf("%s freed %s", node, mebibytes(e.LastUnload.FreedBytes)))
		} else {
			parts = append(parts, node+" reported no unload")
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; its worker shards: " + strings.Join(parts, ", ")
}

func mebibytes(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

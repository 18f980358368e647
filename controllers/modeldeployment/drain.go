package modeldeployment

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// drained says whether the agent reports mr's model unloaded for its drain: its
// Loaded condition says Drained and was written for the current spec (the one with
// spec.drain set).
func drained(mr *v1alpha1.ModelReplica) bool {
	c := meta.FindStatusCondition(mr.Status.Conditions, v1alpha1.ReplicaLoaded)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonDrained &&
		c.ObservedGeneration >= mr.Generation
}

// drainUnload is the unload the agent recorded for mr's drain: status.lastUnload when
// it finished at or after the drain began (lastUnload has one-second resolution),
// nil otherwise.
func drainUnload(mr *v1alpha1.ModelReplica) *v1alpha1.UnloadReport {
	u := mr.Status.LastUnload
	if u == nil || mr.Spec.Drain == nil || u.Time.Before(&metav1.Time{Time: mr.Spec.Drain.Truncate(time.Second)}) {
		return nil
	}
	return u
}

// removedNote is the deployment Event's message for a draining replica deleted for
// why.
func removedNote(mr *v1alpha1.ModelReplica, why string, timeout time.Duration) string {
	switch why {
	case removedDrained:
		if u := drainUnload(mr); u != nil {
			return fmt.Sprintf("Replica %s drained and unloaded on %s, freed %s", mr.Name, mr.Spec.NodeName, mebibytes(u.FreedBytes))
		}
		return fmt.Sprintf("Replica %s drained on %s (its model was not in memory)", mr.Name, mr.Spec.NodeName)
	case removedTimedOut:
		return fmt.Sprintf("Replica %s deleted: its agent on %s did not report the model unloaded within %s", mr.Name,
			mr.Spec.NodeName, timeout)
	}
	return fmt.Sprintf("Replica %s deleted while draining: its Mac %s is not Ready", mr.Name, mr.Spec.NodeName)
}

func mebibytes(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

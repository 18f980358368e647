package modeldeployment

import (
	"cmp"
	"slices"
	"time"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// maxSurge is how many replicas above the desired count a rolling update may run.
// maxUnavailable is 0: a ready replica is deleted only while the others that are
// ready still cover the desired count.
const maxSurge = 1

// replicaInfo is what plan needs to know about one existing replica (not one that
// is already being deleted).
type replicaInfo struct {
	Name    string
	Created time.Time
	// Current: made from the deployment's current template (and reservation).
	Current bool
	// Ready: its Ready condition is True.
	Ready bool
	// Bound: the scheduler has set its nodeName.
	Bound bool
	// Pressure ranks the memory pressure of its Mac: 0 OK (or unknown), 1 Soft,
	// 2 Hard, 3 Emergency (pressureRank).
	Pressure int
	// BrokenGang: it is split across Macs and the Mac of one of its shards is not
	// Ready, or a shard failed (gangBroken).
	BrokenGang bool
}

// actions is what one reconcile pass should do.
type actions struct {
	// Create is how many replicas of the current template to create.
	Create int
	// Delete names the replicas to delete.
	Delete []string
}

// plan decides how to move the replicas toward desired replicas of the current
// template without ever having fewer ready replicas than desired while old ones still
// serve:
//
//   - A broken gang (a replica split across Macs that lost one) never serves again:
//     it is deleted at once, current or old, and a current replica replaces it, to
//     be placed whole.
//   - An old replica that is not ready serves nothing: it is deleted at once.
//   - Without old replicas, the current ones are scaled to desired (creating all
//     missing ones at once, deleting the excess in deletion order).
//   - During a rollout, current replicas are created while the total stays within
//     desired+maxSurge, and ready old replicas are deleted only as far as the ready
//     replicas left still cover desired. A current replica that never becomes ready
//     stalls the rollout with the old replicas serving.
//
// Deletion order (deletionOrder): unbound first, then not ready, then the one whose
// Mac is under the most memory pressure, then newest.
func plan(desired int, replicas []replicaInfo) actions {
	desired = max(desired, 0)
	var act actions
	var cur, old []replicaInfo
	for _, r := range replicas {
		switch {
		case r.BrokenGang:
			act.Delete = append(act.Delete, r.Name)
		case r.Current:
			cur = append(cur, r)
		case !r.Ready:
			act.Delete = append(act.Delete, r.Name)
		default:
			old = append(old, r)
		}
	}

	if len(cur) > desired {
		// Scaled down (possibly mid-rollout): drop the excess current replicas.
		slices.SortFunc(cur, deletionOrder)
		for _, r := range cur[:len(cur)-desired] {
			act.Delete = append(act.Delete, r.Name)
		}
		cur = cur[len(cur)-desired:]
	}

	if len(old) == 0 {
		act.Create = desired - len(cur)
		return act
	}

	// Rolling. Old replicas are all ready here; delete those that the ready current
	// ones (and the other old ones) make redundant.
	ready := len(old)
	for _, r := range cur {
		if r.Ready {
			ready++
		}
	}
	excess := max(0, min(ready-desired, len(old)))
	slices.SortFunc(old, deletionOrder)
	for _, r := range old[:excess] {
		act.Delete = append(act.Delete, r.Name)
	}
	// Then surge: current replicas up to desired, the total within desired+maxSurge.
	act.Create = max(0, min(desired-len(cur), desired+maxSurge-len(cur)-(len(old)-excess)))
	return act
}

// deletionOrder sorts replicas in the order they are deleted on scale-down: unbound
// before bound, not ready before ready, on a Mac under more memory pressure before
// less (removing it frees the memory where it is scarce), newer before older, and by
// name to be deterministic.
func deletionOrder(a, b replicaInfo) int {
	if c := cmp.Compare(boolRank(a.Bound), boolRank(b.Bound)); c != 0 {
		return c
	}
	if c := cmp.Compare(boolRank(a.Ready), boolRank(b.Ready)); c != 0 {
		return c
	}
	if c := cmp.Compare(b.Pressure, a.Pressure); c != 0 {
		return c
	}
	if c := b.Created.Compare(a.Created); c != 0 {
		return c
	}
	return cmp.Compare(b.Name, a.Name)
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// pressureRank orders a Mac's memory pressure for deletionOrder; an unknown level
// ranks as OK.
func pressureRank(p v1alpha1.PressureLevel) int {
	switch p {
	case v1alpha1.PressureSoft:
		return 1
	case v1alpha1.PressureHard:
		return 2
	case v1alpha1.PressureEmergency:
		return 3
	}
	return 0
}

package macnode

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// liveness is what the controller concludes about one MacNode from its Lease.
type liveness struct {
	// ready is the Ready status the controller must set: Unknown when the Lease is
	// missing or expired, empty while the Lease is live (the agent's own Ready
	// condition then stands; the controller never sets Ready=True).
	ready metav1.ConditionStatus
	// message explains an Unknown ready.
	message string
	// deleteReplicas is true once the Lease has been expired for the whole grace
	// period: the node's replicas must be deleted so that they are recreated
	// elsewhere.
	deleteReplicas bool
	// requeueAfter is when this conclusion changes without any watch event: the
	// Lease's expiry while it is live, the end of the grace period while it is not.
	// Zero once the replicas are due for deletion (only an event can change that).
	requeueAfter time.Duration
}

// nodeLiveness decides whether node is alive at now from its Lease (nil when there
// is none) and whether it has been lost for longer than grace.
//
// The grace period starts at the later of the Lease's expiry and the
// lastTransitionTime of a Ready=Unknown condition, so it survives controller
// restarts (the condition is stored on the node) and never starts before the
// current expiry (a Lease that was renewed and expired again restarts it even if
// the agent never set Ready back to True). Cordoning (spec.unschedulable) plays no
// part: a cordoned node keeps its replicas while it is alive and loses them like
// any other node when it is lost.
//
// contact is when the controller's own unbroken contact with the API server began
// (zero: always had it). An agent cannot renew a Lease while the API server is away
// either, so a Lease counts as live until at least a full lease duration after
// contact: after an outage, every agent gets the time to renew before its Mac is
// called lost.
func nodeLiveness(lease *coordinationv1.Lease, node *v1alpha1.MacNode, now, contact time.Time, grace time.Duration) liveness {
	leaseExpiry, hasExpiry := leaseExpiry(lease)
	expiry := leaseExpiry
	if hasExpiry && !contact.IsZero() {
		if e := contact.Add(leaseDuration(lease)); e.After(expiry) {
			expiry = e
		}
	}
	if hasExpiry && now.Before(expiry) {
		return liveness{requeueAfter: expiry.Sub(now)}
	}

	lost := liveness{ready: metav1.ConditionUnknown, message: expiredMessage(lease, node.Name, leaseExpiry, hasExpiry)}
	start := now // the Ready=Unknown this pass sets starts the grace period
	if c := meta.FindStatusCondition(node.Status.Conditions, v1alpha1.MacNodeReady); c != nil && c.Status == metav1.ConditionUnknown {
		start = c.LastTransitionTime.Time
	}
	if hasExpiry && expiry.After(start) {
		start = expiry
	}
	deadline := start.Add(grace)
	if now.Before(deadline) {
		lost.requeueAfter = deadline.Sub(now)
		return lost
	}
	lost.deleteReplicas = true
	return lost
}

// leaseExpiry is renewTime + leaseDurationSeconds; false when the Lease or its
// renewTime is missing. A missing duration counts as zero.
func leaseExpiry(lease *coordinationv1.Lease) (time.Time, bool) {
	if lease == nil || lease.Spec.RenewTime == nil {
		return time.Time{}, false
	}
	return lease.Spec.RenewTime.Add(leaseDuration(lease)), true
}

// leaseDuration is the Lease's leaseDurationSeconds; a missing one counts as zero.
func leaseDuration(lease *coordinationv1.Lease) time.Duration {
	if s := lease.Spec.LeaseDurationSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	return 0
}

// expiredMessage explains why a node is not alive. It depends only on the Lease's
// content, so repeated passes over the same Lease write the same condition.
func expiredMessage(lease *coordinationv1.Lease, node string, expiry time.Time, hasExpiry bool) string {
	switch {
	case lease == nil:
		return fmt.Sprintf("Lease %s/%s does not exist: the agent has not started or cannot reach the API server", v1alpha1.NodeLeaseNamespace, node)
	case !hasExpiry:
		return fmt.Sprintf("Lease %s/%s has never been renewed", v1alpha1.NodeLeaseNamespace, node)
	default:
		return fmt.Sprintf("The agent stopped renewing Lease %s/%s; it expired at %s", v1alpha1.NodeLeaseNamespace, node, expiry.UTC().Format(time.RFC3339Nano))
	}
}

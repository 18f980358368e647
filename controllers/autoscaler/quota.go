package autoscaler

import (
	"context"
	"fmt"
	"math"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/scheduler"
)

// QuotaRoom is what a deployment's namespace's FleetQuota leaves it: the quota's
// limit less what the namespace's other deployments' placed replicas reserve. It
// does not depend on the deployment's own replicas, so a cap derived from it stays
// put as the deployment scales: scaling up to it never moves it.
type QuotaRoom struct {
	// Quota names the FleetQuota (the smallest of the namespace's).
	Quota string
	// Limit is its spec.memory; Others is what the other deployments' placed
	// replicas reserve; PerReplica is the deployment's reservation; all in bytes.
	Limit, Others, PerReplica int64
}

// Fits is how many replicas of the deployment the room holds.
func (q QuotaRoom) Fits() int32 {
	if q.Limit <= q.Others {
		return 0
	}
	return int32(min((q.Limit-q.Others)/q.PerReplica, math.MaxInt32))
}

// quotaRoom computes md's room in its namespace from the namespace's FleetQuotas and
// replicas; ok is false when no quota applies or md's reservation is not known yet.
func quotaRoom(md *v1alpha1.ModelDeployment, quotas []v1alpha1.FleetQuota, replicas []v1alpha1.ModelReplica) (QuotaRoom, bool) {
	q, found := scheduler.Limits(quotas)[md.Namespace]
	room := QuotaRoom{Quota: q.Name, Limit: q.Limit}
	per := md.Status.EstimatedMemory
	if per == nil && md.Spec.Resources != nil {
		per = md.Spec.Resources.Memory
	}
	if !found || per == nil || per.Value() <= 0 {
		return QuotaRoom{}, false
	}
	room.PerReplica = per.Value()
	for i := range replicas {
		r := &replicas[i]
		if r.Namespace == md.Namespace && r.Spec.NodeName != "" && r.Labels[v1alpha1.LabelDeployment] != md.Name {
			room.Others += scheduler.QuotaCharge(r)
		}
	}
	return room, true
}

// limitByQuota keeps a scale-up within the room the quota leaves (ok false: no
// quota): to what fits, or, when not one more replica fits, to the current replicas
// with reason AtQuota. It never scales down for the quota (replicas placed before
// stay placed) and leaves every other recommendation alone. The AtQuota message
// carries only the quota's figures, which change when placements do, not with each
// measurement.
func limitByQuota(rec Recommendation, current int32, room QuotaRoom, ok bool) Recommendation {
	if !ok || rec.Replicas <= current || rec.Replicas <= room.Fits() {
		return rec
	}
	fits := room.Fits()
	why := fmt.Sprintf("FleetQuota %s (%s) has room for %d replicas of %s beside the %s the namespace's other deployments reserve",
		room.Quota, bytes(room.Limit), fits, bytes(room.PerReplica), bytes(room.Others))
	if fits <= current {
		return Recommendation{Replicas: current, Reason: v1alpha1.ReasonAtQuota,
			Message: fmt.Sprintf("the load needs more than %d replicas, and %s; raise the quota or scale down another deployment", current, why)}
	}
	return Recommendation{Replicas: fits, Reason: v1alpha1.ReasonScaledUp,
		Message: fmt.Sprintf("scaled up from %d to %d: the load needs %d, and %s", current, fits, rec.Replicas, why)}
}

func bytes(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

// loadQuotaRoom reads md's namespace's FleetQuotas and replicas from the cache.
func (r *Reconciler) loadQuotaRoom(ctx context.Context, md *v1alpha1.ModelDeployment) (QuotaRoom, bool, error) {
	var quotas v1alpha1.FleetQuotaList
	if err := r.Client.List(ctx, &quotas, client.InNamespace(md.Namespace)); err != nil {
		return QuotaRoom{}, false, fmt.Errorf("listing the namespace's FleetQuotas: %w", err)
	}
	if len(quotas.Items) == 0 {
		return QuotaRoom{}, false, nil
	}
	var replicas v1alpha1.ModelReplicaList
	if err := r.Client.List(ctx, &replicas, client.InNamespace(md.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return QuotaRoom{}, false, fmt.Errorf("listing the namespace's replicas: %w", err)
	}
	room, ok := quotaRoom(md, quotas.Items, replicas.Items)
	return room, ok, nil
}

package scheduler

import (
	"github.com/macfleet/macfleet/api/v1alpha1"
)

// QuotaCharge is what a bound replica counts against its namespace's FleetQuota: its
// memory reservation, whether it reserves it on its Mac (Resident, Pinned) or only
// holds it while loaded (OnDemand); for a replica split across Macs, what its shards
// reserve together. Unbound replicas count nothing.
func QuotaCharge(r *v1alpha1.ModelReplica) int64 {
	if r.Spec.Split != nil {
		return splitCharge(r.Spec.Split)
	}
	return max(r.Spec.MemoryReservation.Value(), 0)
}

// splitCharge is what a split replica's shards reserve together.
func splitCharge(split *v1alpha1.ReplicaSplit) int64 {
	var total int64
	for _, s := range split.Shards {
		total += max(s.Memory.Value(), 0)
	}
	return total
}

// Limits is the quota each namespace with a FleetQuota (not being deleted) is held
// to: the smallest spec.memory of its FleetQuotas (on a tie, the first by name), with
// Used zero.
func Limits(quotas []v1alpha1.FleetQuota) map[string]Quota {
	if len(quotas) == 0 {
		return nil
	}
	out := make(map[string]Quota)
	for i := range quotas {
		fq := &quotas[i]
		if fq.DeletionTimestamp != nil {
			continue
		}
		limit := max(fq.Spec.Memory.Value(), 0)
		if q, ok := out[fq.Namespace]; ok && (q.Limit < limit || q.Limit == limit && q.Name < fq.Name) {
			continue
		}
		out[fq.Namespace] = Quota{Name: fq.Name, Limit: limit}
	}
	return out
}

// quotaSnapshot is the solver's Quotas: the Limits, with Used the charges of each
// namespace's bound replicas, those this scheduler bound but the cache does not show
// yet included.
func quotaSnapshot(quotas []v1alpha1.FleetQuota, bound []boundReplica) map[string]Quota {
	out := Limits(quotas)
	for _, b := range bound {
		if q, ok := out[b.replica.Namespace]; ok {
			charge := QuotaCharge(b.replica)
			if b.split != nil {
				charge = splitCharge(b.split)
			}
			q.Used += charge
			out[b.replica.Namespace] = q
		}
	}
	return out
}

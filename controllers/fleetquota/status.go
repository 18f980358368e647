package fleetquota

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/scheduler"
)

// maxDeployments bounds status.deployments (the API's MaxItems).
const maxDeployments = 64

// quotaStatus is the status of a FleetQuota over the replicas of its namespace: the
// charges of the bound ones (scheduler.QuotaCharge), in total and by deployment
// (largest first, then by name; replicas without a deployment label count in used
// only), and how many unbound ones the scheduler holds back for the quota.
func quotaStatus(replicas []v1alpha1.ModelReplica) v1alpha1.FleetQuotaStatus {
	var used int64
	var waiting int32
	type usage struct {
		replicas int32
		bytes    int64
	}
	byDeployment := map[string]*usage{}
	for i := range replicas {
		r := &replicas[i]
		if r.Spec.NodeName == "" {
			if waitsForQuota(r) {
				waiting++
			}
			continue
		}
		charge := scheduler.QuotaCharge(r)
		used += charge
		name := r.Labels[v1alpha1.LabelDeployment]
		if name == "" {
			continue
		}
		u := byDeployment[name]
		if u == nil {
			u = &usage{}
			byDeployment[name] = u
		}
		u.replicas++
		u.bytes += charge
	}
	st := v1alpha1.FleetQuotaStatus{Used: resource.NewQuantity(used, resource.BinarySI), WaitingReplicas: waiting}
	for name, u := range byDeployment {
		st.Deployments = append(st.Deployments, v1alpha1.FleetQuotaDeployment{
			Name: name, Replicas: u.replicas, Memory: *resource.NewQuantity(u.bytes, resource.BinarySI)})
	}
	slices.SortFunc(st.Deployments, func(a, b v1alpha1.FleetQuotaDeployment) int {
		if c := b.Memory.Cmp(a.Memory); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	if len(st.Deployments) > maxDeployments {
		st.Deployments = st.Deployments[:maxDeployments]
	}
	return st
}

// waitsForQuota reports whether the scheduler holds r back for its namespace's quota.
func waitsForQuota(r *v1alpha1.ModelReplica) bool {
	c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled)
	return r.DeletionTimestamp == nil && c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonQuotaExceeded
}

// quotaRelevant reports whether an update of a replica can change a quota's status:
// bound, resized, being deleted, or held back for the quota or no longer.
func quotaRelevant(old, cur *v1alpha1.ModelReplica) bool {
	return old.Spec.NodeName != cur.Spec.NodeName ||
		old.Spec.MemoryReservation.Cmp(cur.Spec.MemoryReservation) != 0 ||
		(old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil) ||
		waitsForQuota(old) != waitsForQuota(cur) ||
		old.Labels[v1alpha1.LabelDeployment] != cur.Labels[v1alpha1.LabelDeployment]
}

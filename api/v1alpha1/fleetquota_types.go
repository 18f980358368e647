package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReasonQuotaExceeded is the reason of a ModelReplica's Scheduled=False condition, and
// of its deployment's Scheduled and ReplicaFailure conditions, while the replica waits
// because placing it would take its namespace's placed replicas over a FleetQuota's
// spec.memory. The scheduler places it as soon as the quota has room again.
const ReasonQuotaExceeded = "QuotaExceeded"

// FleetQuotaSpec is a namespace's budget of fleet memory.
type FleetQuotaSpec struct {
	// memory is the most memory the namespace's placed ModelReplicas may reserve
	// together: the sum of their spec.memoryReservation, whatever their residency
	// (an OnDemand replica holds that memory whenever it is loaded). A replica that
	// would take the sum past it waits unplaced, with reason QuotaExceeded. 0 lets the
	// namespace place nothing.
	// +required
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isInteger() && !quantity(string(self)).isLessThan(quantity('0'))",message="memory must be a whole, non-negative number of bytes, such as 64Gi"
	Memory resource.Quantity `json:"memory"`
}

// FleetQuotaDeployment is how much of a namespace's fleet memory one deployment's
// placed replicas reserve.
type FleetQuotaDeployment struct {
	// name is the ModelDeployment's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// replicas is the number of its placed replicas.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// memory is the sum of their memory reservations.
	// +optional
	Memory resource.Quantity `json:"memory,omitempty"`
}

// FleetQuotaStatus is written by the fleetquota controller from the namespace's
// ModelReplicas; the scheduler decides from the replicas themselves, not from it.
type FleetQuotaStatus struct {
	// used is the memory the namespace's placed replicas reserve.
	// +optional
	Used *resource.Quantity `json:"used,omitempty"`
	// waitingReplicas counts the namespace's replicas the scheduler holds back because
	// placing them would exceed the quota.
	// +optional
	WaitingReplicas int32 `json:"waitingReplicas,omitempty"`
	// deployments are the deployments whose placed replicas make up used, largest
	// first (at most 64; the rest are left out).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Deployments []FleetQuotaDeployment `json:"deployments,omitempty"`
}

// FleetQuota caps the fleet memory the ModelReplicas of its namespace may reserve,
// as a ResourceQuota caps a namespace's resource requests. The scheduler checks it
// when it places a replica on a Mac (when the memory is reserved); a replica that
// does not fit waits with reason QuotaExceeded, which its ModelDeployment shows, and
// is placed once the quota has room (a deployment scaled down or deleted, the quota
// raised). With several FleetQuotas in a namespace the smallest applies. A namespace
// without one has no limit beyond the fleet's memory.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=fq,categories=macfleet
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.spec.memory`
// +kubebuilder:printcolumn:name="Used",type=string,JSONPath=`.status.used`
// +kubebuilder:printcolumn:name="Waiting",type=integer,JSONPath=`.status.waitingReplicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FleetQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec FleetQuotaSpec `json:"spec"`
	// +optional
	Status FleetQuotaStatus `json:"status,omitempty"`
}

// FleetQuotaList is a list of FleetQuotas.
//
// +kubebuilder:object:root=true
type FleetQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FleetQuota `json:"items"`
}

func init() {
	SchemeBuilder.Register(&FleetQuota{}, &FleetQuotaList{})
}

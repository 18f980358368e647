package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TokenBudgetSpec limits what a namespace's callers, or one of its keys, may use
// through the gateway. Tokens are a request's input (prompt) plus output (generated)
// tokens, as its usage reports them. The windows are fixed and aligned to UTC: a
// minute, an hour and a day each start afresh at their boundary, which is when a
// budget spent in one resets.
//
// +kubebuilder:validation:XValidation:rule="has(self.tokensPerMinute) || has(self.tokensPerHour) || has(self.tokensPerDay) || has(self.concurrentRequests)",message="a TokenBudget sets at least one of tokensPerMinute, tokensPerHour, tokensPerDay and concurrentRequests"
type TokenBudgetSpec struct {
	// key, when set, is the name of an API key Secret (type macfleet.dev/api-key) of
	// this namespace, or the name of one of its ServiceAccounts as
	// "system:serviceaccount:NAME": the budget applies to that caller alone. Unset,
	// it applies to all of the namespace's callers together.
	// +optional
	// +kubebuilder:validation:MaxLength=300
	Key string `json:"key,omitempty"`

	// tokensPerMinute is the most tokens admitted in one UTC minute.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TokensPerMinute *int64 `json:"tokensPerMinute,omitempty"`
	// tokensPerHour is the most tokens admitted in one UTC hour.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TokensPerHour *int64 `json:"tokensPerHour,omitempty"`
	// tokensPerDay is the most tokens admitted in one UTC day.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TokensPerDay *int64 `json:"tokensPerDay,omitempty"`
	// concurrentRequests is the most requests in flight at once, across the
	// gateway's replicas.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ConcurrentRequests *int32 `json:"concurrentRequests,omitempty"`
}

// TokenBudgetStatus is written by the gateway's replicas: the leases they hold on
// the budget's windows while more than one of them is live.
type TokenBudgetStatus struct {
	// leases are the gateway replicas' shares of the budget's current windows. While
	// more than one replica is live, a replica admits a request only within the
	// tokens it leased for each window, and leases more with a conditional write
	// (resourceVersion), so two replicas never take the same room. A lease counts
	// for its window only, and stops counting when its replica stops renewing its
	// usage records (15 s).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Leases []TokenLease `json:"leases,omitempty"`
}

// TokenLease is one gateway replica's share of one window of a TokenBudget.
type TokenLease struct {
	// gateway is the replica holding the lease (its --gateway-id).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Gateway string `json:"gateway"`
	// window is the limit the lease is a share of.
	// +required
	Window LeaseWindow `json:"window"`
	// start is when the window begins (UTC); the lease ends with it.
	// +required
	Start metav1.Time `json:"start"`
	// tokens is how many of the window's tokens the replica may admit: its usage
	// and the reservations of its requests in flight stay within them.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9007199254740991
	Tokens int64 `json:"tokens"`
	// renewTime is when the replica last wrote the lease.
	// +required
	RenewTime metav1.MicroTime `json:"renewTime"`
}

// LeaseWindow is the window of a TokenLease.
// +kubebuilder:validation:Enum=minute;hour;day
type LeaseWindow string

// The windows a TokenLease may share.
const (
	LeaseMinute LeaseWindow = "minute"
	LeaseHour   LeaseWindow = "hour"
	LeaseDay    LeaseWindow = "day"
)

// TokenBudget caps the tokens and concurrent requests of a namespace's callers, or of
// one of its keys, as a ResourceQuota caps a namespace's resources. The gateway checks
// every budget that applies to a request before it queues it; a request over one is
// answered 429 with Retry-After and an error naming the budget and when it resets.
// Several budgets may apply to one request (its namespace's, its key's): each must
// have room. A namespace's teams are usually given read access only, so that the
// platform sets their budgets.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=tb,categories=macfleet
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Key",type=string,JSONPath=`.spec.key`
// +kubebuilder:printcolumn:name="Per-Minute",type=integer,JSONPath=`.spec.tokensPerMinute`
// +kubebuilder:printcolumn:name="Per-Hour",type=integer,JSONPath=`.spec.tokensPerHour`
// +kubebuilder:printcolumn:name="Per-Day",type=integer,JSONPath=`.spec.tokensPerDay`
// +kubebuilder:printcolumn:name="Concurrent",type=integer,JSONPath=`.spec.concurrentRequests`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TokenBudget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TokenBudgetSpec `json:"spec"`
	// +optional
	Status TokenBudgetStatus `json:"status,omitempty"`
}

// TokenBudgetList is a list of TokenBudgets.
//
// +kubebuilder:object:root=true
type TokenBudgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TokenBudget `json:"items"`
}

func init() {
	SchemeBuilder.Register(&TokenBudget{}, &TokenBudgetList{})
}

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxUsageCount is the most any count of a TokenUsage holds (2^53 - 1, the largest
// integer a float64 holds exactly, as Prometheus and JSON readers keep numbers): the
// gateway's ledger saturates there instead of wrapping, and the schema refuses a
// count above it or below zero (the markers state the same number).
const MaxUsageCount = 1<<53 - 1

// KeyUsage is what one caller used of one deployment on the record's day.
type KeyUsage struct {
	// key is the caller: the name of an API key Secret of the record's namespace, or
	// "system:serviceaccount:NAME" for one of its ServiceAccounts.
	// +required
	// +kubebuilder:validation:MaxLength=300
	Key string `json:"key"`
	// deployment is the ModelDeployment answered, as namespace/name.
	// +required
	// +kubebuilder:validation:MaxLength=317
	Deployment string `json:"deployment"`
	// requests counts the answers a replica gave.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9007199254740991
	Requests int64 `json:"requests,omitempty"`
	// inputTokens counts the prompts' tokens.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9007199254740991
	InputTokens int64 `json:"inputTokens,omitempty"`
	// cachedTokens counts the part of inputTokens the prompt cache served.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9007199254740991
	CachedTokens int64 `json:"cachedTokens,omitempty"`
	// outputTokens counts the tokens generated, every choice's.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9007199254740991
	OutputTokens int64 `json:"outputTokens,omitempty"`
}

// KeyWindow is one caller's tokens in the current UTC minute and hour, and its
// requests in flight, as one gateway replica counted them: what the other replicas
// add to their own counts when they check a TokenBudget.
type KeyWindow struct {
	// key is the caller, as in KeyUsage.
	// +required
	// +kubebuilder:validation:MaxLength=300
	Key string `json:"key"`
	// minute is the start of the UTC minute minuteTokens counts.
	// +optional
	Minute *metav1.Time `json:"minute,omitempty"`
	// minuteTokens counts input plus output tokens in that minute.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9007199254740991
	MinuteTokens int64 `json:"minuteTokens,omitempty"`
	// hour is the start of the UTC hour hourTokens counts.
	// +optional
	Hour *metav1.Time `json:"hour,omitempty"`
	// hourTokens counts input plus output tokens in that hour.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9007199254740991
	HourTokens int64 `json:"hourTokens,omitempty"`
	// inFlight is the caller's requests in flight on this replica when written.
	// +optional
	// +kubebuilder:validation:Minimum=0
	InFlight int32 `json:"inFlight,omitempty"`
	// reservedTokens is what the caller's requests in flight on this replica may
	// still use when written (each its prompt's estimate plus max_tokens × n): the
	// other replicas count it in every current window until the requests end.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=9007199254740991
	ReservedTokens int64 `json:"reservedTokens,omitempty"`
}

// TokenUsageSpec is one gateway replica's count of one namespace's usage on one UTC
// day.
type TokenUsageSpec struct {
	// gateway names the gateway replica that counts (its pod name).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Gateway string `json:"gateway"`
	// day is the UTC day counted, as YYYY-MM-DD.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`
	Day string `json:"day"`
	// renewTime is when the gateway last wrote the record.
	// +optional
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// usage is the day's usage by caller and deployment.
	// +optional
	// +listType=map
	// +listMapKey=key
	// +listMapKey=deployment
	// +kubebuilder:validation:MaxItems=2048
	Usage []KeyUsage `json:"usage,omitempty"`
	// windows are the callers' current minute and hour, for budgets.
	// +optional
	// +listType=map
	// +listMapKey=key
	// +kubebuilder:validation:MaxItems=2048
	Windows []KeyWindow `json:"windows,omitempty"`
}

// TokenUsage is the gateways' ledger: each gateway replica keeps one per namespace
// and UTC day in that namespace, holding what it counted there, so that a team reads
// its usage with kubectl or `macfleet usage`, and the replicas enforce TokenBudgets
// together. It is written by the gateway only, like a Lease by its holder.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=tu,categories=macfleet
// +kubebuilder:printcolumn:name="Day",type=string,JSONPath=`.spec.day`
// +kubebuilder:printcolumn:name="Gateway",type=string,JSONPath=`.spec.gateway`
// +kubebuilder:printcolumn:name="Renewed",type=date,JSONPath=`.spec.renewTime`
type TokenUsage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TokenUsageSpec `json:"spec"`
}

// TokenUsageList is a list of TokenUsages.
//
// +kubebuilder:object:root=true
type TokenUsageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TokenUsage `json:"items"`
}

func init() {
	SchemeBuilder.Register(&TokenUsage{}, &TokenUsageList{})
}

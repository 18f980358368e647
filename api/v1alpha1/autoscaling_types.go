package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DeploymentAutoscaling is the ModelDeployment condition the autoscaler owns. It is
// present only while spec.autoscaling is set: True while the autoscaler sizes
// spec.replicas from measured load, Unknown (reason LoadUnknown) while it has no fresh
// load measurement and keeps the replicas it has. Its message states that the
// autoscaler owns spec.replicas and why it chose the last recommendation.
const DeploymentAutoscaling = "Autoscaling"

// The wake signal (AnnotationWakeRequested): a gateway renews it every
// WakeRenewInterval while it holds requests, and the autoscaler counts it as a held
// request for WakeHold after the time it carries (in either direction, so clocks may
// differ by up to WakeHold minus WakeRenewInterval).
const (
	WakeRenewInterval = 10 * time.Second
	WakeHold          = 30 * time.Second
)

// Reasons of the Autoscaling condition; status.autoscaling.reason repeats the last one.
const (
	// ReasonScaledUp: in-flight requests stayed above the target of the current
	// replicas for the whole stabilization window, or requests arrived at zero replicas.
	ReasonScaledUp = "ScaledUp"
	// ReasonScaledDown: the load of the whole scaleDownDelay fits fewer replicas.
	ReasonScaledDown = "ScaledDown"
	// ReasonScaleUpStabilizing: the load needs more replicas, not yet for a whole
	// stabilization window.
	ReasonScaleUpStabilizing = "ScaleUpStabilizing"
	// ReasonScaleDownDelayed: the load fits fewer replicas, not yet for a whole
	// scaleDownDelay.
	ReasonScaleDownDelayed = "ScaleDownDelayed"
	// ReasonWithinTarget: the replicas match the load.
	ReasonWithinTarget = "WithinTarget"
	// ReasonAtMaxReplicas: the load needs more than maxReplicas.
	ReasonAtMaxReplicas = "AtMaxReplicas"
	// ReasonAtQuota: the load needs more replicas than the namespace's FleetQuota has
	// room for beside the other deployments' placed replicas; the autoscaler keeps
	// the replicas it has.
	ReasonAtQuota = "AtQuota"
	// ReasonOutsideLimits: spec.replicas was outside minReplicas..maxReplicas and was
	// brought inside.
	ReasonOutsideLimits = "OutsideLimits"
	// ReasonLoadUnknown: no fresh load measurement; the replicas are kept.
	ReasonLoadUnknown = "LoadUnknown"
)

// AutoscalingSpec sizes a deployment from its load: the requests in flight on its
// replicas (being generated or waiting for a sequence slot on the replica's engine),
// summed over the replicas. The autoscaler wants
// ceil(inFlight / targetInFlight) replicas, within minReplicas..maxReplicas.
//
// While autoscaling is set the autoscaler owns spec.replicas (through the same field
// the scale subresource drives): leave replicas out of applied manifests.
//
// +kubebuilder:validation:XValidation:rule="self.minReplicas <= self.maxReplicas",message="autoscaling.minReplicas must not exceed autoscaling.maxReplicas"
type AutoscalingSpec struct {
	// minReplicas is the fewest replicas kept (0: scale to zero after scaleDownDelay
	// without a single request).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="self >= 0",message="autoscaling.minReplicas must not be negative"
	MinReplicas *int32 `json:"minReplicas,omitempty"`

	// maxReplicas is the most replicas the autoscaler asks for.
	// +required
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 1024",message="autoscaling.maxReplicas must be between 1 and 1024"
	MaxReplicas int32 `json:"maxReplicas"`

	// targetInFlight is the number of requests in flight per replica the autoscaler
	// aims for. Default: engine.parallel (one replica is at target when every sequence
	// slot of its engine is busy).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 4096",message="autoscaling.targetInFlight must be between 1 and 4096 requests"
	TargetInFlight *int32 `json:"targetInFlight,omitempty"`

	// scaleDownDelay is how long the load must fit fewer replicas before they are
	// removed; the replicas kept are what the highest load of that period needs. A
	// deployment with minReplicas 0 scales to zero after this long without a request.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+(\\\\.[0-9]+)?(ms|s|m|h))+$') && duration(self) <= duration('24h')",message="autoscaling.scaleDownDelay must be a duration such as 90s or 5m, at most 24h"
	ScaleDownDelay *metav1.Duration `json:"scaleDownDelay,omitempty"`

	// stabilizationWindow is how long the load must need more replicas before they are
	// added; the replicas added are what the lowest load of that window needs. 0 scales
	// up on the first measurement.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+(\\\\.[0-9]+)?(ms|s|m|h))+$') && duration(self) <= duration('1h')",message="autoscaling.stabilizationWindow must be a duration such as 0s, 30s or 2m, at most 1h"
	StabilizationWindow *metav1.Duration `json:"stabilizationWindow,omitempty"`
}

// AutoscalingStatus is the autoscaler's last decision, written by the autoscaler only
// (the rest of the status is the modeldeployment controller's).
type AutoscalingStatus struct {
	// recommendedReplicas is the replica count the autoscaler last recommended.
	// +optional
	RecommendedReplicas int32 `json:"recommendedReplicas,omitempty"`
	// reason is the reason of the last recommendation (the Autoscaling condition's).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`
	// lastScaleTime is when the autoscaler last changed spec.replicas.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`
}

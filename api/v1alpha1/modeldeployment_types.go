package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ModelDeployment condition types.
const (
	// DeploymentAvailable is True when at least replicas − maxUnavailable (0 during a
	// rollout: every desired replica) are Ready — Deployment semantics with
	// maxUnavailable 0.
	DeploymentAvailable = "Available"
	// DeploymentProgressing is True while replicas are being created, placed, loaded or
	// replaced, and False with a reason when progress is blocked.
	DeploymentProgressing = "Progressing"
	// DeploymentScheduled is False when a replica cannot be placed or its memory cannot
	// be estimated; the message says why.
	DeploymentScheduled = "Scheduled"
	// DeploymentReplicaFailure is True while a replica cannot download or load its
	// model (checksum mismatch, not a GGUF file, a source the policy denies, a runner
	// that fails to load it) or waits unplaced because its namespace is out of
	// FleetQuota (QuotaExceeded): reason and message are the first failing replica's.
	// It is absent otherwise, as on a Deployment.
	DeploymentReplicaFailure = "ReplicaFailure"
)

// ModelDeployment condition reasons.
const (
	ReasonMinimumReplicasAvailable   = "MinimumReplicasAvailable"
	ReasonMinimumReplicasUnavailable = "MinimumReplicasUnavailable"
	ReasonNewReplicasAvailable       = "NewReplicasAvailable"
	ReasonReplicasUpdating           = "ReplicasUpdating"
	ReasonScalingReplicas            = "ScalingReplicas"
	ReasonAllReplicasScheduled       = "AllReplicasScheduled"
	ReasonEstimateFailed             = "MemoryEstimateFailed"
	ReasonUnschedulable              = "Unschedulable"
	ReasonNoReplicas                 = "NoReplicasRequested"
	ReasonScheduledPending           = "SchedulingPending"
	// ReasonSplitUnsupported: Scheduled is False because a replica fits no single Mac
	// and, although placement.maxMacsPerReplica allows a split, the model keeps a
	// recurrent state that split workers do not compute (a recurrent or hybrid
	// architecture such as qwen3next), so its replicas are placed whole only. The
	// message names the architecture and the fix: a Mac with the replica's memory
	// free, or a smaller quant or context.
	ReasonSplitUnsupported = "SplitUnsupported"
	// ReasonProgressDeadlineExceeded: Progressing is False because the deployment has
	// not made progress (a replica created, updated, ready or removed) for
	// spec.progressDeadlineSeconds while it still had some to make.
	ReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
)

// PlacementStrategy scores the Macs a replica fits on.
// +kubebuilder:validation:Enum=BinPack;Spread
type PlacementStrategy string

const (
	// BinPack puts a replica on the Mac it fills most tightly, keeping whole Macs free
	// for large models.
	BinPack PlacementStrategy = "BinPack"
	// Spread puts a replica on the Mac with the fewest replicas of its deployment, then
	// the most free memory.
	Spread PlacementStrategy = "Spread"
)

// Placement constrains and scores where replicas go.
type Placement struct {
	// nodeSelector restricts replicas to MacNodes with these labels.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// strategy is BinPack (default) or Spread.
	// +optional
	// +kubebuilder:default=BinPack
	Strategy PlacementStrategy `json:"strategy,omitempty"`

	// maxReplicasPerNode caps how many replicas of this deployment share one Mac.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 64",message="maxReplicasPerNode must be between 1 and 64"
	MaxReplicasPerNode int32 `json:"maxReplicasPerNode,omitempty"`

	// maxMacsPerReplica is how many Macs one replica may span. 1 (the default) keeps
	// every replica on one Mac. Above 1, a replica that fits no single Mac is placed
	// as a gang: its layers split into contiguous ranges over 2 to maxMacsPerReplica
	// distinct Macs, sized to each Mac's free memory, all bound at once or none.
	// Each shard counts as a replica of the deployment on its Mac for
	// maxReplicasPerNode. Absent means 1 (not defaulted in the stored object, so
	// deployments written before the field existed read back unchanged).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 16",message="maxMacsPerReplica must be between 1 (every replica on one Mac) and 16"
	MaxMacsPerReplica int32 `json:"maxMacsPerReplica,omitempty"`
}

// ModelResources overrides what the controller would estimate.
type ModelResources struct {
	// memory is the memory to reserve for one replica. Required for file:// sources,
	// whose GGUF header the controller cannot read; otherwise it overrides the
	// estimate from the GGUF header.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="resources.memory must be positive"
	Memory *resource.Quantity `json:"memory,omitempty"`
}

// ModelDeploymentSpec is the desired state of a model served by the fleet.
//
// +kubebuilder:validation:XValidation:rule="!has(self.idleTimeout) || (has(self.residency) && self.residency == 'OnDemand')",message="idleTimeout is only allowed with residency OnDemand"
// +kubebuilder:validation:XValidation:rule="!self.model.source.startsWith('file://') || (has(self.resources) && has(self.resources.memory))",message="a file:// source needs resources.memory: the controller cannot read the GGUF header of a file on a Mac"
// +kubebuilder:validation:XValidation:rule="!has(self.placement) || !has(self.placement.maxMacsPerReplica) || self.placement.maxMacsPerReplica <= 1 || !has(self.residency) || self.residency != 'OnDemand'",message="placement.maxMacsPerReplica above 1 needs residency Resident or Pinned: a split replica's shards are sized to the memory reserved on each Mac, and OnDemand reserves none"
// +kubebuilder:validation:XValidation:rule="!has(self.placement) || !has(self.placement.maxMacsPerReplica) || self.placement.maxMacsPerReplica <= 1 || !self.model.source.startsWith('file://')",message="placement.maxMacsPerReplica above 1 needs an hf://, ollama:// or https:// source: the layers are split by the GGUF header, which the controller cannot read from a file:// source"
// +kubebuilder:validation:XValidation:rule="!has(self.model.projector) || !self.model.projector.startsWith('file://') || (has(self.resources) && has(self.resources.memory))",message="a file:// projector needs resources.memory: the controller cannot read the size of a file on a Mac"
// +kubebuilder:validation:XValidation:rule="!has(self.model.projector) || !has(self.placement) || !has(self.placement.maxMacsPerReplica) || self.placement.maxMacsPerReplica <= 1",message="a projector needs every replica on one Mac (placement.maxMacsPerReplica 1): a replica split across Macs does not answer images"
// +kubebuilder:validation:XValidation:rule="!has(self.model.draft) || !self.model.draft.startsWith('file://') || (has(self.resources) && has(self.resources.memory))",message="a file:// draft needs resources.memory: the controller cannot read the GGUF header of a file on a Mac"
// +kubebuilder:validation:XValidation:rule="!has(self.model.draft) || !has(self.placement) || !has(self.placement.maxMacsPerReplica) || self.placement.maxMacsPerReplica <= 1",message="a draft model needs every replica on one Mac (placement.maxMacsPerReplica 1): a replica split across Macs does not load one"
// +kubebuilder:validation:XValidation:rule="!has(self.engine) || !has(self.engine.splitPipeline) || self.engine.splitPipeline <= 1 || (has(self.placement) && has(self.placement.maxMacsPerReplica) && self.placement.maxMacsPerReplica > 1)",message="engine.splitPipeline above 1 needs placement.maxMacsPerReplica above 1: only the head of a replica split across Macs decodes in several contexts"
type ModelDeploymentSpec struct {
	// model is the GGUF file to serve and the names it answers to.
	// +required
	Model ModelSource `json:"model"`

	// engine configures the llama.cpp engine.
	// +optional
	Engine EngineSpec `json:"engine,omitempty"`

	// replicas is the number of Macs that serve the model.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="self >= 0",message="replicas must not be negative"
	Replicas *int32 `json:"replicas,omitempty"`

	// residency is Resident (default), Pinned or OnDemand.
	// +optional
	// +kubebuilder:default=Resident
	Residency Residency `json:"residency,omitempty"`

	// idleTimeout unloads an OnDemand model after this long without requests.
	// +optional
	IdleTimeout *metav1.Duration `json:"idleTimeout,omitempty"`

	// resources overrides the memory estimate.
	// +optional
	Resources *ModelResources `json:"resources,omitempty"`

	// placement constrains and scores the Macs replicas go to.
	// +optional
	Placement Placement `json:"placement,omitempty"`

	// autoscaling, when set, makes the autoscaler own replicas: it sizes the
	// deployment from the requests in flight on its replicas.
	// +optional
	Autoscaling *AutoscalingSpec `json:"autoscaling,omitempty"`

	// access grants other namespaces' API keys the use of this deployment through the
	// gateway. Keys of the deployment's own namespace and admin keys always have it.
	// It scopes the teams' keys of a gateway run with --tenant-keys; a gateway without
	// them has no team keys to scope (its callers are admins or unauthenticated).
	// +optional
	Access *Access `json:"access,omitempty"`

	// progressDeadlineSeconds is how long the deployment may go without progress
	// (a replica created, updated, ready or removed) while it has some to make,
	// before its Progressing condition turns False with ProgressDeadlineExceeded.
	// As for a Deployment, nothing else happens: the controller keeps trying.
	// +optional
	// +kubebuilder:default=600
	// +kubebuilder:validation:XValidation:rule="self >= 10 && self <= 86400",message="progressDeadlineSeconds must be between 10 and 86400 (24h)"
	ProgressDeadlineSeconds *int32 `json:"progressDeadlineSeconds,omitempty"`
}

// Access says which namespaces' API keys may use a deployment besides its own.
type Access struct {
	// namespaces lists the namespaces whose keys may use the deployment; "*" grants
	// every namespace. A key of a namespace not listed is answered as if the
	// deployment did not exist.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.all(n, n == '*' || n.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))",message="access.namespaces: each entry must be a namespace name (a DNS-1123 label) or \"*\" for every namespace"
	Namespaces []string `json:"namespaces,omitempty"`
}

// ModelDeploymentStatus is written by the modeldeployment controller, but for
// autoscaling and the Autoscaling condition, which the autoscaler writes.
type ModelDeploymentStatus struct {
	// observedGeneration is the generation the controller last acted on successfully.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// replicas is the number of ModelReplicas that exist.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// readyReplicas is the number of replicas whose model is loaded and serving.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// updatedReplicas is the number of replicas of the current template.
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`
	// ready is readyReplicas/replicas-desired, for display.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Ready string `json:"ready,omitempty"`
	// selector is the label selector of the replicas, for the scale subresource.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Selector string `json:"selector,omitempty"`
	// nodes are the Macs that hold a replica.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=253
	Nodes []string `json:"nodes,omitempty"`
	// estimatedMemory is the memory reserved per replica (estimate or override).
	// +optional
	EstimatedMemory *resource.Quantity `json:"estimatedMemory,omitempty"`
	// measuredMemory is the largest footprint (peak or resident) a loaded replica of
	// the current model and engine settings measured: one of this deployment's, or of
	// another deployment in the namespace with the same model file and engine
	// settings. It is kept while no replica is loaded, so a replica placed later —
	// after a scale to zero — reserves by it, and dropped when the model or the engine
	// settings change.
	// +optional
	MeasuredMemory *resource.Quantity `json:"measuredMemory,omitempty"`
	// measuredFootprintHash names the model and engine settings measuredMemory was
	// measured with.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	MeasuredFootprintHash string `json:"measuredFootprintHash,omitempty"`
	// display is the memory above (estimated, measured) formatted for people, for kubectl's columns.
	// +optional
	Display *MemoryDisplay `json:"display,omitempty"`
	// endpoint is the in-cluster URL of the deployment's Service.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Endpoint string `json:"endpoint,omitempty"`
	// lastProgressTime is when the deployment last made progress: a replica created,
	// updated, ready or removed, or a new generation observed.
	// +optional
	LastProgressTime *metav1.Time `json:"lastProgressTime,omitempty"`
	// autoscaling is the autoscaler's last recommendation, while spec.autoscaling is set.
	// +optional
	Autoscaling *AutoscalingStatus `json:"autoscaling,omitempty"`
	// conditions are Available, Progressing and Scheduled, and Autoscaling while
	// spec.autoscaling is set.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ModelDeployment is a model served by N replicas on the fleet's Macs.
//
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="a ModelDeployment's name must be at most 63 characters: it names its Service and labels its replicas"
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=md,categories=macfleet
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model.source`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.status.display.estimated`
// +kubebuilder:printcolumn:name="Measured",type=string,JSONPath=`.status.display.measured`,priority=1
// +kubebuilder:printcolumn:name="Nodes",type=string,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="Failure",type=string,JSONPath=`.status.conditions[?(@.type=="ReplicaFailure")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ModelDeployment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ModelDeploymentSpec `json:"spec"`
	// +optional
	Status ModelDeploymentStatus `json:"status,omitempty"`
}

// ModelDeploymentList is a list of ModelDeployments.
//
// +kubebuilder:object:root=true
type ModelDeploymentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelDeployment `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ModelDeployment{}, &ModelDeploymentList{})
}

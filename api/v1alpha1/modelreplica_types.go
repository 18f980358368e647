package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ModelReplica condition types. Scheduled is written by the scheduler (before
// binding); the others only by the agent of the replica's node.
const (
	// ReplicaScheduled is True once the replica is bound to a Mac, False with a
	// kube-scheduler-style message while no Mac fits.
	ReplicaScheduled = "Scheduled"
	// ReplicaDownloaded is True when the model file is in the node's store and verified.
	ReplicaDownloaded = "Downloaded"
	// ReplicaLoaded is True while a runner holds the model in memory.
	ReplicaLoaded = "Loaded"
	// ReplicaReady is True while the replica serves requests (OnDemand replicas are
	// Ready when they can be loaded on the first request).
	ReplicaReady = "Ready"
)

// ModelReplica condition reasons.
const (
	ReasonBound            = "Bound"
	ReasonDownloading      = "Downloading"
	ReasonDownloadFailed   = "DownloadFailed"
	ReasonChecksumMismatch = "ChecksumMismatch"
	ReasonStored           = "Stored"
	ReasonLoading          = "Loading"
	ReasonLoadFailed       = "LoadFailed"
	ReasonRunnerReady      = "RunnerReady"
	ReasonWaitingForDemand = "WaitingForDemand"
	// ReasonWaitingForShard: the Loaded and Ready conditions of a split replica's head
	// while a worker shard's Mac has not reported its shard Ready in status.shards: a
	// partial gang never serves (the message names the shard).
	ReasonWaitingForShard = "WaitingForShard"
	ReasonUnloaded        = "Unloaded"
	ReasonDraining        = "Draining"
	// ReasonDrained: the Loaded condition of a replica with spec.drain set, once the
	// agent has unloaded its model for good; the deployment controller then deletes it.
	ReasonDrained = "Drained"
	// ReasonNodeUnreachable: the macnode controller set Ready=Unknown because the
	// replica's Mac stopped renewing its Lease (the Mac's agent, when it is back,
	// writes Ready again).
	ReasonNodeUnreachable = "NodeUnreachable"
	// ReasonAgentNotServing: the Ready condition of a replica whose runner is ready on
	// a Mac whose agent has no serving certificate yet (the manager has not signed its
	// CertificateSigningRequest): the agent answers no request until it has one.
	ReasonAgentNotServing = "AgentNotServing"
)

// ReplicaPhase summarises a replica's lifecycle for display.
// +kubebuilder:validation:Enum=Pending;Downloading;Loading;Ready;Standby;Draining;Failed
type ReplicaPhase string

const (
	ReplicaPending     ReplicaPhase = "Pending"
	ReplicaDownloading ReplicaPhase = "Downloading"
	ReplicaLoading     ReplicaPhase = "Loading"
	ReplicaRunning     ReplicaPhase = "Ready"
	// ReplicaStandby: an OnDemand replica whose model is on disk but not in memory.
	ReplicaStandby  ReplicaPhase = "Standby"
	ReplicaDraining ReplicaPhase = "Draining"
	ReplicaFailed   ReplicaPhase = "Failed"
)

// ModelReplicaTemplate is the part of a ModelDeployment's spec that a replica runs.
// A change to it rolls the deployment's replicas.
type ModelReplicaTemplate struct {
	// +required
	Model ModelSource `json:"model"`
	// +optional
	Engine EngineSpec `json:"engine,omitempty"`
	// +optional
	// +kubebuilder:default=Resident
	Residency Residency `json:"residency,omitempty"`
	// +optional
	IdleTimeout *metav1.Duration `json:"idleTimeout,omitempty"`
}

// ModelReplicaSpec is one replica of a model, bound to one Mac (nodeName) or, when
// split, to the distinct Macs of its shards (split; nodeName is the head's).
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.nodeName) || size(oldSelf.nodeName) == 0 || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)",message="nodeName is immutable once set: delete the replica to move it"
// +kubebuilder:validation:XValidation:rule="self.template == oldSelf.template",message="template is immutable: the deployment replaces replicas instead"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.split) || (has(self.split) && self.split == oldSelf.split)",message="split is immutable once set: delete the replica to place it again"
// +kubebuilder:validation:XValidation:rule="!has(self.split) || (has(self.nodeName) && self.split.shards[0].node == self.nodeName)",message="split.shards[0] is the head: its node must be nodeName, and both are set in the same write"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.layerMemory) || (has(self.layerMemory) && self.layerMemory == oldSelf.layerMemory)",message="layerMemory is immutable: the deployment replaces replicas instead"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.drain) || (has(self.drain) && self.drain == oldSelf.drain)",message="drain cannot be changed or cleared once set: a draining replica is deleted"
type ModelReplicaSpec struct {
	// template is the model and engine this replica runs.
	// +required
	Template ModelReplicaTemplate `json:"template"`

	// templateHash identifies the template; replicas of the deployment's current
	// template are "updated".
	// +required
	// +kubebuilder:validation:MaxLength=64
	TemplateHash string `json:"templateHash"`

	// memoryReservation is the memory the scheduler reserves for the replica on its
	// Mac (Resident and Pinned) or requires free under the ceiling (OnDemand).
	// +required
	MemoryReservation resource.Quantity `json:"memoryReservation"`

	// nodeName is the Mac the replica is bound to, set once by the scheduler.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName,omitempty"`

	// layerMemory is how the replica's memory divides over the model's layers, set by
	// the deployment controller when the deployment's maxMacsPerReplica is above 1;
	// the scheduler sizes a split replica's shards by it.
	// +optional
	LayerMemory *LayerMemory `json:"layerMemory,omitempty"`

	// split is set by the scheduler, with nodeName, when the replica fits no single
	// Mac and is placed across several: each shard's Mac, layers and reservation.
	// Absent for a replica on one Mac.
	// +optional
	Split *ReplicaSplit `json:"split,omitempty"`

	// drain, when set, is when the deployment controller chose to remove this replica:
	// the gateway no longer routes to it; the agent finishes its in-flight requests,
	// unloads the model, keeps it unloaded and records status.lastUnload; then the
	// controller deletes the replica (at the latest after its drain timeout). Set
	// once, by the deployment controller.
	// +optional
	Drain *metav1.Time `json:"drain,omitempty"`

	// access is the deployment's spec.access, kept in step by the deployment
	// controller. It is not part of the template: a change grants or revokes at once,
	// without rolling the replicas. The node agent reads it to let in-cluster callers
	// of other namespaces use the replica (see docs/tenancy.md).
	// +optional
	Access *Access `json:"access,omitempty"`

	// budgetedNamespaces are the namespaces that may use the replica (its own and
	// those its access grants) and have at least one TokenBudget, kept in step by the
	// deployment controller in place, as access is. The node agent refuses their
	// in-cluster callers on the deployment's own Service (403): their requests go
	// through the gateway, which holds them to their budgets and counts their usage.
	// +optional
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=63
	BudgetedNamespaces []string `json:"budgetedNamespaces,omitempty"`
}

// DownloadProgress is how far the node has fetched the model file.
type DownloadProgress struct {
	// +optional
	DownloadedBytes int64 `json:"downloadedBytes,omitempty"`
	// +optional
	TotalBytes int64 `json:"totalBytes,omitempty"`
}

// ModelReplicaStatus is written by the agent of the replica's node (and the Scheduled
// condition by the scheduler before the replica is bound, and Ready=Unknown by the
// macnode controller while the node is lost).
type ModelReplicaStatus struct {
	// +optional
	Phase ReplicaPhase `json:"phase,omitempty"`
	// observedTemplateHash is the template the agent last acted on.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	ObservedTemplateHash string `json:"observedTemplateHash,omitempty"`
	// +optional
	Progress *DownloadProgress `json:"progress,omitempty"`
	// endpoint is host:port of the agent serving this replica.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Endpoint string `json:"endpoint,omitempty"`
	// +optional
	Memory ReplicaMemory `json:"memory,omitempty"`
	// display is the reservation and the resident memory formatted for people, for
	// kubectl's columns.
	// +optional
	Display *MemoryDisplay `json:"display,omitempty"`
	// lastUnload is what the agent measured when it last unloaded this replica's model;
	// for a split replica, the head's runner (each shard's own is in
	// shards[].lastUnload, measured by that shard's Mac).
	// +optional
	LastUnload *UnloadReport `json:"lastUnload,omitempty"`
	// shards is what each Mac of a split replica reports about its shard, one entry
	// per node of spec.split, each written by that Mac's agent.
	// +optional
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MaxItems=16
	Shards []ShardStatus `json:"shards,omitempty"`
	// pathsOff lists the paths the node's runner serves the replica's model without,
	// each with its reason: a path that could not serve the model correctly is turned
	// off, never taken to a wrong answer (the prompt cache of a model that keeps a
	// recurrent state). As the runner last reported it, kept after an unload; absent
	// while the model serves every path or its runner has not reported yet.
	// +optional
	// +listType=map
	// +listMapKey=path
	// +kubebuilder:validation:MaxItems=8
	PathsOff []PathOff `json:"pathsOff,omitempty"`
	// vision says that the node's runner of the replica answers images: it loaded the
	// deployment's projector (spec.model.projector). As the loaded runner reports it;
	// absent while none is loaded, or for a model without a projector.
	// +optional
	Vision bool `json:"vision,omitempty"`
	// conditions are Scheduled, Downloaded, Loaded and Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ServingPath names a way the runner reuses a model's state that it may serve a model
// without.
// +kubebuilder:validation:Enum=PromptCache
type ServingPath string

const (
	// ServingPathPromptCache is the prompt cache and every path through it: its hot
	// and SSD tiers, the states peers export and import, and the prefixes one request
	// shares with another in flight. Without it each request prefills its prompt.
	ServingPathPromptCache ServingPath = "PromptCache"
)

// PathOff is a path the replica's model is served without, and why.
type PathOff struct {
	// path is the path turned off.
	// +required
	Path ServingPath `json:"path"`
	// reason says why, in words.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason"`
}

// ModelReplica is one copy of a ModelDeployment's model, placed on one Mac. The
// deployment controller creates and deletes them, the scheduler binds them, the
// node's agent loads them and reports their status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mr,categories=macfleet
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Macs",type=string,JSONPath=`.spec.split.macs`,priority=1,description="The Macs of a replica split across several, head first"
// +kubebuilder:printcolumn:name="Layers",type=string,JSONPath=`.spec.split.layers`,priority=1,description="Each shard's layers (inclusive), in the order of Macs"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Drain",type=date,JSONPath=`.spec.drain`,priority=1
// +kubebuilder:printcolumn:name="Reserved",type=string,JSONPath=`.status.display.reserved`
// +kubebuilder:printcolumn:name="Resident",type=string,JSONPath=`.status.display.resident`
// +kubebuilder:printcolumn:name="Freed",type=integer,JSONPath=`.status.lastUnload.freedBytes`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ModelReplica struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ModelReplicaSpec `json:"spec"`
	// +optional
	Status ModelReplicaStatus `json:"status,omitempty"`
}

// ModelReplicaList is a list of ModelReplicas.
//
// +kubebuilder:object:root=true
type ModelReplicaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelReplica `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ModelReplica{}, &ModelReplicaList{})
}

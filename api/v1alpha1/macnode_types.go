package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MacNode condition types.
const (
	// MacNodeReady is True while the node's agent renews its Lease and its pool is
	// healthy; the macnode controller sets it Unknown when the Lease expires.
	MacNodeReady = "Ready"
	// MacNodeMemoryPressure is True while the pool is at or above its soft watermark.
	MacNodeMemoryPressure = "MemoryPressure"
	// MacNodeCeilingCapped is True while the agent reports a memory ceiling above what
	// the control plane believes of this Mac (spec.memoryCeiling, the memory the agent
	// measured, or the largest memory of its chip): the scheduler places replicas by
	// the cap, not the report. Set by
	// the macnode controller; absent while the report is within its bounds.
	MacNodeCeilingCapped = "CeilingCapped"
)

// MacNode condition reasons.
const (
	// ReasonAgentReady: the agent is running and renewing its Lease.
	ReasonAgentReady = "AgentReady"
	// ReasonLeaseExpired: the agent stopped renewing its Lease (set by the controller).
	ReasonLeaseExpired = "NodeLeaseExpired"
	// ReasonAgentStopping: the agent is shutting down cleanly.
	ReasonAgentStopping = "AgentStopping"
	// ReasonPressureOK, ReasonPressureSoft, … mirror the pool's pressure level.
	ReasonPressureOK        = "PressureOK"
	ReasonPressureSoft      = "SoftWatermarkExceeded"
	ReasonPressureHard      = "HardWatermarkExceeded"
	ReasonPressureEmergency = "CeilingExceeded"
	// ReasonChipMemoryExceeded: the reported ceiling is above the largest unified
	// memory of the reported chip (or of any Mac, for a chip macfleet does not know).
	ReasonChipMemoryExceeded = "ChipMemoryExceeded"
	// ReasonOperatorCeilingExceeded: the reported ceiling is above spec.memoryCeiling.
	ReasonOperatorCeilingExceeded = "OperatorCeilingExceeded"
	// ReasonMeasuredMemoryExceeded: the reported ceiling is above the unified memory
	// the agent measured (status.hardware.unifiedMemory, or the first one it reported:
	// status.effectiveCeiling.measuredMemory).
	ReasonMeasuredMemoryExceeded = "MeasuredMemoryExceeded"
)

// PressureLevel is the pool's memory pressure.
// +kubebuilder:validation:Enum=OK;Soft;Hard;Emergency
type PressureLevel string

const (
	PressureOK        PressureLevel = "OK"
	PressureSoft      PressureLevel = "Soft"
	PressureHard      PressureLevel = "Hard"
	PressureEmergency PressureLevel = "Emergency"
)

// MacNodeSpec is what an administrator sets on a Mac.
type MacNodeSpec struct {
	// unschedulable cordons the Mac: no new replicas are placed on it; the ones it has
	// keep running.
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`

	// memoryCeiling overrides the memory the pool may use on this Mac. It can only lower
	// the ceiling the agent derives from the hardware. It is also the operator's bound
	// on what the scheduler believes of the Mac, whatever its agent reports, so a node
	// identity may not set it (macfleet nodes credentials --memory-ceiling does).
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="memoryCeiling must be positive"
	MemoryCeiling *resource.Quantity `json:"memoryCeiling,omitempty"`

	// link is the Mac's network link as the operator knows it. When a replica is split
	// across Macs, the scheduler prefers, among gangs of as few Macs, the Macs with
	// the fastest link. It overrides status.link (what the agent measures).
	// +optional
	Link *Link `json:"link,omitempty"`
}

// AcceleratorStatus is one GPU with memory of its own.
type AcceleratorStatus struct {
	// name is the card's name, e.g. "NVIDIA H100 80GB HBM3".
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`
	// memory is the card's own memory.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
}

// HardwareStatus is what the agent detected.
type HardwareStatus struct {
	// chip is the SoC name, e.g. "Apple M2 Max".
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Chip string `json:"chip,omitempty"`
	// cpuCores is the number of CPU cores.
	// +optional
	CPUCores int32 `json:"cpuCores,omitempty"`
	// performanceCores are the cores the agent's thread policy gives a runner whose
	// deployment sets no engine.threads and whose agent no --runner-threads: the
	// performance cores on macOS, the physical cores elsewhere.
	// +optional
	PerformanceCores int32 `json:"performanceCores,omitempty"`
	// gpuCores is the number of GPU cores, when known.
	// +optional
	GPUCores int32 `json:"gpuCores,omitempty"`
	// unifiedMemory is the Mac's physical memory.
	// +optional
	UnifiedMemory *resource.Quantity `json:"unifiedMemory,omitempty"`
	// metalWorkingSet is Metal's recommended maximum working set size.
	// +optional
	MetalWorkingSet *resource.Quantity `json:"metalWorkingSet,omitempty"`
	// wiredLimit is iogpu.wired_limit_mb when set.
	// +optional
	WiredLimit *resource.Quantity `json:"wiredLimit,omitempty"`
	// accelerators are the node's GPUs with memory of their own (a discrete card), as
	// their driver reports them; empty on a Mac, whose GPU shares the unified memory.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Accelerators []AcceleratorStatus `json:"accelerators,omitempty"`
}

// AgentStatus describes the node agent.
type AgentStatus struct {
	// version is the agent's version.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Version string `json:"version,omitempty"`
	// address is where the agent serves the OpenAI API, host:port.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Address string `json:"address,omitempty"`
}

// NodeMemoryStatus is the pool's memory account on this Mac.
type NodeMemoryStatus struct {
	// ceiling is the most memory the pool may use: min(unified memory − reserve,
	// Metal working set or wired limit, spec.memoryCeiling).
	// +optional
	Ceiling *resource.Quantity `json:"ceiling,omitempty"`
	// softWatermark (90% of ceiling): new loads pause, idle models are evicted.
	// +optional
	SoftWatermark *resource.Quantity `json:"softWatermark,omitempty"`
	// hardWatermark (95% of ceiling): in-flight work of the LRU model is aborted.
	// +optional
	HardWatermark *resource.Quantity `json:"hardWatermark,omitempty"`
	// used is the measured footprint of the runners plus the agent.
	// +optional
	Used *resource.Quantity `json:"used,omitempty"`
	// agent is the measured footprint of the agent itself, part of used. The pool
	// counts it when it admits a load, so the scheduler counts it too: what a Mac
	// offers replicas is its ceiling less committed less agent.
	// +optional
	Agent *resource.Quantity `json:"agent,omitempty"`
	// committed is the sum of the reservations of loaded and loading models.
	// +optional
	Committed *resource.Quantity `json:"committed,omitempty"`
	// pressure is the current pressure level.
	// +optional
	Pressure PressureLevel `json:"pressure,omitempty"`
	// evictions counts models the pool evicted since the agent started.
	// +optional
	Evictions int64 `json:"evictions,omitempty"`
	// freedBytesTotal is the memory all unloads gave back since the agent started.
	// +optional
	FreedBytesTotal int64 `json:"freedBytesTotal,omitempty"`
}

// EffectiveCeiling is what the control plane believes of a Mac's memory ceiling.
type EffectiveCeiling struct {
	// bytes is the ceiling.
	Bytes resource.Quantity `json:"bytes"`
	// display is bytes formatted for people, for kubectl's Ceiling column.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Display string `json:"display,omitempty"`
	// source is the bound that decided it: Reported (the agent's report, within the
	// bounds), Operator (spec.memoryCeiling), Measured (the unified memory the agent
	// measured) or Chip (the largest memory of the chip).
	// +optional
	// +kubebuilder:validation:Enum=Reported;Operator;Measured;Chip
	Source string `json:"source,omitempty"`
	// measuredMemory is the unified memory the Mac's agent measured when the
	// controller first saw it (status.hardware.unifiedMemory), kept from then on: a
	// Mac's memory cannot grow, so a later, larger claim (a bigger chip, more memory)
	// is not believed. An administrator clears it by removing status.effectiveCeiling
	// when the MacNode's name is given to another Mac.
	// +optional
	MeasuredMemory *resource.Quantity `json:"measuredMemory,omitempty"`
}

// MacNodeStatus is written by the node's agent (and the Ready condition by the
// controller when the agent's Lease expires).
type MacNodeStatus struct {
	// +optional
	Hardware HardwareStatus `json:"hardware,omitempty"`
	// +optional
	Agent AgentStatus `json:"agent,omitempty"`
	// +optional
	Memory NodeMemoryStatus `json:"memory,omitempty"`
	// display is the memory's ceiling, used and committed figures formatted for
	// people, for kubectl's columns (the ceiling as the agent reports it).
	// +optional
	Display *MemoryDisplay `json:"display,omitempty"`
	// effectiveCeiling is the ceiling the scheduler places replicas by: the reported
	// status.memory.ceiling capped by spec.memoryCeiling, by the memory the agent
	// measured (first and now) and by the largest memory of the reported chip. The macnode controller writes it; a node may not
	// (config/admission/node-restriction.yaml).
	// +optional
	EffectiveCeiling *EffectiveCeiling `json:"effectiveCeiling,omitempty"`
	// link is the Mac's network link as its agent measures it (a later agent writes
	// it; spec.link, set by the operator, takes precedence).
	// +optional
	Link *Link `json:"link,omitempty"`
	// conditions are Ready and MemoryPressure (written by the agent), and CeilingCapped
	// (written by the macnode controller while the agent reports more memory than the
	// Mac may have).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MacNode is one Apple Silicon Mac in the fleet. Its agent creates it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=mn,categories=macfleet
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Chip",type=string,JSONPath=`.status.hardware.chip`
// +kubebuilder:printcolumn:name="Ceiling",type=string,JSONPath=`.status.effectiveCeiling.display`,description="The memory ceiling the scheduler places replicas by: the reported one capped by spec.memoryCeiling, the memory the agent measured and the chip's memory"
// +kubebuilder:printcolumn:name="Reported",type=string,JSONPath=`.status.display.ceiling`,description="The memory ceiling the Mac's agent reports"
// +kubebuilder:printcolumn:name="Used",type=string,JSONPath=`.status.display.used`
// +kubebuilder:printcolumn:name="Committed",type=string,JSONPath=`.status.display.committed`
// +kubebuilder:printcolumn:name="Pressure",type=string,JSONPath=`.status.memory.pressure`
// +kubebuilder:printcolumn:name="Cordoned",type=boolean,JSONPath=`.spec.unschedulable`,priority=1
// +kubebuilder:printcolumn:name="Link",type=string,JSONPath=`.spec.link.bandwidth`,priority=1,description="The link bandwidth the operator set, in bits per second"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MacNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec MacNodeSpec `json:"spec,omitempty"`
	// +optional
	Status MacNodeStatus `json:"status,omitempty"`
}

// MacNodeList is a list of MacNodes.
//
// +kubebuilder:object:root=true
type MacNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MacNode `json:"items"`
}

func init() {
	SchemeBuilder.Register(&MacNode{}, &MacNodeList{})
}

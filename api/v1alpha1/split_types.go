package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A replica split across Macs (issue 27): a deployment whose
// spec.placement.maxMacsPerReplica is above 1 lets the scheduler place a replica that
// no single Mac holds as a gang of shards on distinct Macs. Shard 0, the head, runs
// the runner that owns the tokenizer, sampling, the prompt cache and the API; every
// other shard is a worker holding its layers' weights and KV cache.

// MaxMacsPerReplica is the most Macs one replica may span.
const MaxMacsPerReplica = 16

// ShardLabelPrefix starts the label the scheduler puts on a split replica for each Mac
// that holds one of its worker shards (every shard but the head, whose Mac finds the
// replica by spec.nodeName): the agent of that Mac lists and watches the replicas
// carrying its own label (ShardLabel), and the node authorizer lets it read only those.
const ShardLabelPrefix = "shard.macfleet.dev/"

// ShardLabelWorker is the value of a ShardLabel.
const ShardLabelWorker = "worker"

// ShardLabel is the label key that marks a replica as holding a worker shard on node:
// ShardLabelPrefix and the first 20 bytes of the SHA-256 of the node's name in hex, as
// a label key's name is at most 63 characters and a MacNode's name up to 253.
func ShardLabel(node string) string {
	sum := sha256.Sum256([]byte(node))
	return ShardLabelPrefix + hex.EncodeToString(sum[:20])
}

// WorkerNodes are the Macs of a split's worker shards (every shard but the head), in
// shard order; none for nil.
func (s *ReplicaSplit) WorkerNodes() []string {
	if s == nil || len(s.Shards) < 2 {
		return nil
	}
	nodes := make([]string, 0, len(s.Shards)-1)
	for _, sh := range s.Shards[1:] {
		nodes = append(nodes, sh.Node)
	}
	return nodes
}

// NextWorker is the Mac of the worker shard right after node's worker shard, in
// shard order: the worker there takes node's worker's output over the split's peer
// link (docs/split-model.md). "" when node holds no worker shard or holds the last.
func (s *ReplicaSplit) NextWorker(node string) string {
	w := s.WorkerNodes()
	for i := 0; i+1 < len(w); i++ {
		if w[i] == node {
			return w[i+1]
		}
	}
	return ""
}

// PreviousWorker is the Mac of the worker shard right before node's worker shard, the
// one Mac that may open node's peer link. "" when node holds no worker shard or holds
// the first (whose input comes from the head's runner).
func (s *ReplicaSplit) PreviousWorker(node string) string {
	w := s.WorkerNodes()
	for i := 1; i < len(w); i++ {
		if w[i] == node {
			return w[i-1]
		}
	}
	return ""
}

// LayerMemory is how a replica's memory divides over the model's layers, so that the
// scheduler can size each shard of a split replica. The deployment controller sets it
// (from the GGUF estimate, scaled to the replica's memoryReservation) on the replicas
// of deployments with maxMacsPerReplica above 1. head + layers × perLayer is at least
// memoryReservation: one shard holding every layer reserves what a single-Mac replica
// does.
type LayerMemory struct {
	// layers is the number of transformer blocks of the model.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4096
	Layers int32 `json:"layers"`
	// perLayer is the memory of one block: its weights and its share of the KV cache.
	// +required
	PerLayer resource.Quantity `json:"perLayer"`
	// head is what shard 0 reserves besides its blocks: the token embeddings, the
	// output layer, the compute buffers (one per llama context: engine.splitPipeline),
	// the vocabulary and the runner's baseline.
	// +required
	Head resource.Quantity `json:"head"`
	// worker is what every other shard reserves besides its blocks: its process's
	// baseline and compute buffer (one per llama context of the head:
	// engine.splitPipeline).
	// +required
	Worker resource.Quantity `json:"worker"`
}

// ReplicaShard is one Mac's part of a split replica.
type ReplicaShard struct {
	// node is the MacNode running the shard.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`
	// firstLayer and lastLayer are the shard's blocks, both inclusive, counted from 0.
	// The shards' ranges are contiguous, in shard order, and cover every block once.
	// +required
	// +kubebuilder:validation:Minimum=0
	FirstLayer int32 `json:"firstLayer"`
	// +required
	// +kubebuilder:validation:Minimum=0
	LastLayer int32 `json:"lastLayer"`
	// memory is what the shard reserves on its Mac; it counts in that Mac's committed
	// memory.
	// +required
	Memory resource.Quantity `json:"memory"`
}

// ReplicaSplit is where the shards of a split replica run, set once by the scheduler
// together with nodeName (the head's Mac): a gang is bound in one write, whole.
// +kubebuilder:validation:XValidation:rule="self.shards.all(s, s.firstLayer <= s.lastLayer)",message="each shard's firstLayer must not be after its lastLayer (both are inclusive)"
type ReplicaSplit struct {
	// shards are the shards in pipeline order; shards[0] is the head.
	// +required
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MinItems=2
	// +kubebuilder:validation:MaxItems=16
	Shards []ReplicaShard `json:"shards"`
	// macs is the shards' Macs in shard order, comma-separated, for kubectl's columns.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Macs string `json:"macs,omitempty"`
	// layers is the shards' layer ranges in shard order, comma-separated
	// ("0-40,41-79"), for kubectl's columns.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Layers string `json:"layers,omitempty"`
}

// ShardStatus is what the agent of one shard's Mac reports about it. The list is keyed
// by node, so each Mac's agent owns its own entry.
type ShardStatus struct {
	// node is the MacNode running the shard.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`
	// phase is the shard's own lifecycle; the replica is Ready only while every
	// shard is.
	// +optional
	Phase ReplicaPhase `json:"phase,omitempty"`
	// resident is the shard's process's measured footprint now.
	// +optional
	Resident *resource.Quantity `json:"resident,omitempty"`
	// peak is the highest footprint measured since the shard was loaded.
	// +optional
	Peak *resource.Quantity `json:"peak,omitempty"`
	// lastUnload is what this shard's Mac measured when it last unloaded the shard:
	// its own process's footprint before the stop and the memory its Mac got back
	// after the settle barrier. A worker's Mac unloads its shard when the replica
	// drains, once the head's runner is unloaded; the head's entry repeats the
	// replica's status.lastUnload.
	// +optional
	LastUnload *UnloadReport `json:"lastUnload,omitempty"`
}

// Link is a Mac's network link to the other Macs of the fleet, as a split replica's
// activations cross it once per layer boundary per step.
type Link struct {
	// bandwidth is the link's throughput in bits per second, e.g. "10G" for 10 GbE or
	// "80G" for Thunderbolt 5.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="link.bandwidth must be positive, in bits per second (e.g. 10G)"
	Bandwidth *resource.Quantity `json:"bandwidth,omitempty"`
	// rtt is the round-trip time to the other Macs.
	// +optional
	RTT *metav1.Duration `json:"rtt,omitempty"`
}

// DrainReported says whether the agent of mr's Mac (the head's, for a split replica)
// reports its model unloaded for the drain: its Loaded condition is False/Drained and
// was written for the current spec (the one with spec.drain set).
func (mr *ModelReplica) DrainReported() bool {
	if mr.Spec.Drain == nil {
		return false
	}
	c := meta.FindStatusCondition(mr.Status.Conditions, ReplicaLoaded)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == ReasonDrained &&
		c.ObservedGeneration >= mr.Generation
}

// UnloadedSince says whether u is an unload that finished at or after t (lastUnload
// has one-second resolution: an unload in t's second counts).
func (u *UnloadReport) UnloadedSince(t *metav1.Time) bool {
	return u != nil && t != nil && !u.Time.Before(&metav1.Time{Time: t.Truncate(time.Second)})
}

// ShardEntry is the entry of node in mr's status.shards (nil when it has none).
func (mr *ModelReplica) ShardEntry(node string) *ShardStatus {
	for i := range mr.Status.Shards {
		if mr.Status.Shards[i].Node == node {
			return &mr.Status.Shards[i]
		}
	}
	return nil
}

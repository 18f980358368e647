package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/engine"
)

// Well-known labels and annotations.
const (
	// LabelDeployment names the ModelDeployment a ModelReplica belongs to.
	LabelDeployment = "macfleet.dev/deployment"
	// LabelTemplateHash is the hash of the replica template a ModelReplica was made from.
	LabelTemplateHash = "macfleet.dev/template-hash"
	// LabelChip is the Mac's chip, e.g. "Apple-M2-Max" (set by the agent).
	LabelChip = "macfleet.dev/chip"
	// LabelMemoryGiB is the Mac's unified memory in GiB (set by the agent).
	LabelMemoryGiB = "macfleet.dev/memory-gib"
	// AnnotationWakeRequested is set on an autoscaled ModelDeployment by a gateway that
	// holds requests for it while no replica is routable (at zero replicas, or while its
	// replicas load): an RFC 3339 time, renewed every WakeRenewInterval while requests
	// are held. The autoscaler counts a request held while the time is within WakeHold
	// of its clock, so it scales a deployment at zero up to one replica and keeps a
	// loading replica while requests wait for it.
	AnnotationWakeRequested = "autoscaling.macfleet.dev/wake-requested"
	// NodeLeaseNamespace holds one coordination.k8s.io Lease per MacNode, renewed by its agent.
	NodeLeaseNamespace = "macfleet-node-lease"
	// ReplicaNodeNameField is the selectable field agents use to watch only their replicas.
	ReplicaNodeNameField = "spec.nodeName"
	// SystemNamespace is where the manager, the gateway and the fleet CA live.
	SystemNamespace = "macfleet-system"
	// NodeIdentityNamespace holds one ServiceAccount per Mac, named like its MacNode;
	// the agent of that Mac authenticates as it.
	NodeIdentityNamespace = "macfleet-nodes"
	// AgentClusterRole is the ClusterRole bound to every node identity.
	AgentClusterRole = "macfleet-agent"
	// FleetTokenSecret (in SystemNamespace) held, under FleetTokenKey, the token that
	// callers presented to agents before agents took certificates. Nothing creates or
	// reads it now; a cluster installed before may still have it (delete it).
	FleetTokenSecret = "macfleet-fleet-token"
	FleetTokenKey    = "token"
	// CASecret (in SystemNamespace) holds the fleet CA that the manager keeps and
	// rotates (package pki): the signing CA, its successor and its predecessor.
	// CABundleConfigMap (in SystemNamespace) publishes the CA certificates every
	// caller and agent trusts, under CABundleKey.
	CASecret          = "macfleet-ca"
	CABundleConfigMap = "macfleet-ca"
	CABundleKey       = "ca.crt"
	// GatewayTLSSecret (in SystemNamespace) holds the gateway's client certificate
	// (tls.crt, tls.key) and the CA bundle (ca.crt), issued and renewed by the manager.
	GatewayTLSSecret = "macfleet-gateway-tls"
	// MetricsTLSSecret (in SystemNamespace) holds the client certificate of the
	// scraper of the agents' /metrics (macfleet://metrics/<name>: /metrics and the
	// health probes, nothing else), its key and the CA bundle, issued and renewed by
	// the manager.
	MetricsTLSSecret = "macfleet-metrics-tls"
	// APIKeyIndexSecret (in SystemNamespace) is the teams' API keys as the gateways
	// read them: hashes and metadata, never a key (tenancy.Index), published by the
	// manager from the key Secrets (controllers/apikeyindex). The gateways read this
	// Secret, and no team's.
	APIKeyIndexSecret = "macfleet-api-keys"
	// HeaderReplica is set by the gateway on requests it forwards to an agent: the
	// namespace/name of the ModelReplica that must serve the request.
	HeaderReplica = "X-Macfleet-Replica"
	// HeaderQueued and HeaderGateway are set by the gateway on requests it forwards to
	// an agent: how many requests for the same deployment wait in that gateway's queue
	// as it sends this one, and the gateway's id (one per gateway process). The agent
	// reports the latest of each gateway in /api/status, and the autoscaler adds them
	// up: the load that waits before reaching any replica, without a write to the API
	// server.
	HeaderQueued  = "X-Macfleet-Queued"
	HeaderGateway = "X-Macfleet-Gateway"
	// HeaderQueuedSeconds is set beside HeaderQueued: the integral of that queue's
	// length over time since the gateway started (request-seconds, a decimal). Its
	// growth between two reports over the time between them is the mean queue in
	// between, which a report of the queue at one instant cannot tell when requests
	// are short: the autoscaler measures with it.
	HeaderQueuedSeconds = "X-Macfleet-Queued-Seconds"
)

// Residency says how a model stays in a Mac's memory.
// +kubebuilder:validation:Enum=Resident;Pinned;OnDemand
type Residency string

const (
	// ResidencyResident reserves the model's memory on its node and loads it eagerly.
	// LRU may still evict it under memory pressure.
	ResidencyResident Residency = "Resident"
	// ResidencyPinned is Resident and never evicted by LRU or idle timeout.
	ResidencyPinned Residency = "Pinned"
	// ResidencyOnDemand reserves nothing: the model must fit its node alone, is loaded
	// on the first request and unloaded after idleTimeout or under pressure.
	ResidencyOnDemand Residency = "OnDemand"
)

// KVCacheType is the element type of the KV cache (defined, with its values, in
// package engine).
type KVCacheType = engine.KVCacheType

// KV cache types.
const (
	KVCacheF16  = engine.KVCacheF16
	KVCacheQ8_0 = engine.KVCacheQ8_0
	KVCacheQ4_0 = engine.KVCacheQ4_0
)

// ModelSource says where a model's GGUF file comes from.
//
// +kubebuilder:validation:XValidation:rule="!has(self.projectorSHA256) || has(self.projector)",message="projectorSHA256 needs projector: it is the SHA-256 of the projector's file"
// +kubebuilder:validation:XValidation:rule="!has(self.draftSHA256) || has(self.draft)",message="draftSHA256 needs draft: it is the SHA-256 of the draft model's file"
type ModelSource struct {
	// source is the GGUF file's location: hf://<org>/<repo>/<file>.gguf,
	// ollama://<name>:<tag>, http(s)://… or file:///absolute/path on the Mac. A model
	// stored in parts is named by its first part (NAME-00001-of-0000N.gguf).
	// +required
	// +kubebuilder:validation:MinLength=8
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^(hf|ollama|https?|file)://.+')",message="source must start with hf://, ollama://, http://, https:// or file:// and name a file"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('file://') || self.startsWith('file:///')",message="a file:// source must be an absolute path (file:///path/to/model.gguf)"
	// +kubebuilder:validation:XValidation:rule="!self.matches('-[0-9]{5}-of-[0-9]{5}[.][gG][gG][uU][fF]([@?].*)?$') || self.matches('-00001-of-[0-9]{5}[.][gG][gG][uU][fF]([@?].*)?$')",message="source names a later part of a model stored in parts: name its first part (NAME-00001-of-0000N.gguf), from which every part is fetched"
	Source string `json:"source"`

	// sha256 is the expected SHA-256 of the file, verified after download.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-f0-9]{64}$')",message="sha256 must be 64 lowercase hexadecimal characters"
	SHA256 string `json:"sha256,omitempty"`

	// projector is the location of the model's multimodal projector (an mmproj GGUF),
	// in the same schemes as source: the agent downloads it beside the model and the
	// runner answers images with it (image_url, image blocks, input_image). Without
	// it an image in a request is a 400 that names this field.
	// +optional
	// +kubebuilder:validation:MinLength=8
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^(hf|ollama|https?|file)://.+')",message="projector must start with hf://, ollama://, http://, https:// or file:// and name a file"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('file://') || self.startsWith('file:///')",message="a file:// projector must be an absolute path (file:///path/to/mmproj.gguf)"
	// +kubebuilder:validation:XValidation:rule="!self.matches('-[0-9]{5}-of-[0-9]{5}[.][gG][gG][uU][fF]([@?].*)?$')",message="a projector is one file: it cannot be stored in parts"
	Projector string `json:"projector,omitempty"`

	// projectorSHA256 is the expected SHA-256 of the projector, verified after
	// download.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-f0-9]{64}$')",message="projectorSHA256 must be 64 lowercase hexadecimal characters"
	ProjectorSHA256 string `json:"projectorSHA256,omitempty"`

	// draft is the location of a draft model for speculative decoding (a smaller GGUF
	// with the model's vocabulary, e.g. a small model of the same family), in the same
	// schemes as source: the agent downloads it beside the model and the runner drafts
	// with it where prompt lookup finds nothing to copy. Answers are the same with or
	// without it; it costs its weights and its KV cache for every slot, counted in
	// the replica's memory. A draft of another vocabulary fails the replica's load,
	// naming the difference.
	// +optional
	// +kubebuilder:validation:MinLength=8
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^(hf|ollama|https?|file)://.+')",message="draft must start with hf://, ollama://, http://, https:// or file:// and name a file"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('file://') || self.startsWith('file:///')",message="a file:// draft must be an absolute path (file:///path/to/draft.gguf)"
	// +kubebuilder:validation:XValidation:rule="!self.matches('-[0-9]{5}-of-[0-9]{5}[.][gG][gG][uU][fF]([@?].*)?$')",message="a draft model is one file: it cannot be stored in parts"
	Draft string `json:"draft,omitempty"`

	// draftSHA256 is the expected SHA-256 of the draft model, verified after
	// download.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-f0-9]{64}$')",message="draftSHA256 must be 64 lowercase hexadecimal characters"
	DraftSHA256 string `json:"draftSHA256,omitempty"`

	// servedName is the name clients put in the OpenAI "model" field; defaults to the
	// deployment's name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9._:/-]*$')",message="servedName may contain letters, digits, '.', '_', ':', '/' and '-', and must start with a letter or digit"
	ServedName string `json:"servedName,omitempty"`

	// aliases are further names the model answers to.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	Aliases []string `json:"aliases,omitempty"`
}

// EngineSpec configures the llama.cpp engine that serves the model.
//
// +kubebuilder:validation:XValidation:rule="!has(self.splitPipeline) || self.splitPipeline < 1 || !has(self.parallel) || self.parallel % self.splitPipeline == 0",message="parallel must be a multiple of splitPipeline: every llama context of a split head gets parallel/splitPipeline slots"
type EngineSpec struct {
	// Settings are the engine settings every layer shares (contextLength, parallel,
	// kvCacheType, threads, splitPipeline): package engine holds them with their bounds, defaults
	// and the runner's flags.
	engine.Settings `json:",inline"`

	// promptCache configures the prompt cache of the replicas' runners: the KV state
	// of recent conversations, kept in memory (the hot tier, a share of the Mac's hot
	// budget) and on the Mac's disk (the SSD tier, kept across agent restarts), so the
	// next turn of a conversation restores its prefix instead of prefilling it again.
	// Unset: enabled, with the agent's settings.
	// +optional
	PromptCache *PromptCacheSpec `json:"promptCache,omitempty"`
}

// PromptCacheSpec is a deployment's prompt cache settings. The agent's own settings
// (--prompt-cache-hot-bytes, --prompt-cache-ssd-bytes) bound them: a deployment can
// narrow what a Mac allows, never widen it.
//
// +kubebuilder:validation:XValidation:rule="!has(self.enabled) || self.enabled || (!has(self.hotBytes) && !has(self.ssdBytes))",message="hotBytes and ssdBytes need the prompt cache enabled: remove them or set enabled to true"
// +kubebuilder:validation:XValidation:rule="!has(self.enabled) || self.enabled || !has(self.peerWarmup) || !self.peerWarmup",message="peerWarmup needs the prompt cache enabled: remove it or set enabled to true"
type PromptCacheSpec struct {
	// enabled turns the prompt cache on or off.
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`

	// hotBytes caps each replica's share of its Mac's hot budget, which the agent
	// shares equally among the runners that use the cache. 0 keeps nothing in memory.
	// Unset: no cap of its own.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",message="hotBytes must not be negative"
	HotBytes *resource.Quantity `json:"hotBytes,omitempty"`

	// ssdBytes is the SSD quota of the model on each Mac (its replicas there share
	// one directory), at most the agent's per-model quota. 0 keeps nothing on disk.
	// Unset: the agent's quota.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",message="ssdBytes must not be negative"
	SSDBytes *resource.Quantity `json:"ssdBytes,omitempty"`

	// peerWarmup lets the gateway warm a replica whose runner starts cold (new,
	// rescheduled, restarted) with prompt states its replicas on other Macs hold, of
	// the partitions (tenants) its own Mac served lately. It needs the gateway's peer
	// fetch on (--peer-fetch). It is off unless set: a warm-up hands the cold Mac
	// conversations it did not serve itself, a choice the deployment's owner makes.
	// +optional
	PeerWarmup *bool `json:"peerWarmup,omitempty"`
}

// ReplicaMemory is what a replica reserved and what its runner measured.
type ReplicaMemory struct {
	// estimated is the memory the controller reserved for the model.
	// +optional
	Estimated *resource.Quantity `json:"estimated,omitempty"`
	// resident is the runner's measured footprint now.
	// +optional
	Resident *resource.Quantity `json:"resident,omitempty"`
	// peak is the highest footprint measured since the model was loaded.
	// +optional
	Peak *resource.Quantity `json:"peak,omitempty"`
}

// UnloadOutcome says whether the memory freed by an unload could be measured.
// +kubebuilder:validation:Enum=Settled;Indeterminate;TimedOut
type UnloadOutcome string

const (
	// UnloadSettled: the host gauge showed the model's memory back within the settle window.
	UnloadSettled UnloadOutcome = "Settled"
	// UnloadIndeterminate: other engines were working, so the host gauge could not
	// attribute freed memory to this unload; freedBytes is the runner's last footprint.
	UnloadIndeterminate UnloadOutcome = "Indeterminate"
	// UnloadTimedOut: the memory had not come back when the settle window ended.
	UnloadTimedOut UnloadOutcome = "TimedOut"
)

// UnloadReport is what the agent measured when it last unloaded a model.
type UnloadReport struct {
	// reason is why the model was unloaded, e.g. Deleted, Idle, Pressure, Evicted, Admin.
	// +required
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
	// freedBytes is the memory the unload gave back (never negative).
	// +required
	// +kubebuilder:validation:Minimum=0
	FreedBytes int64 `json:"freedBytes"`
	// residentBytes is the runner's footprint just before it was stopped.
	// +required
	// +kubebuilder:validation:Minimum=0
	ResidentBytes int64 `json:"residentBytes"`
	// outcome says how freedBytes was measured.
	// +required
	Outcome UnloadOutcome `json:"outcome"`
	// duration is the time from the unload decision to the report.
	// +required
	Duration metav1.Duration `json:"duration"`
	// time is when the unload finished.
	// +required
	Time metav1.Time `json:"time"`
}

// MemoryDisplay is memory formatted for people — binary units with one decimal
// ("100.1 MiB", "3.5 GiB"), as the console prints it — for kubectl's columns, which can
// only show a field as it is stored: a quantity reads "131Mi" in one row and
// "102488Ki" in the next. The quantities beside these strings are the source of truth;
// whoever writes a quantity writes its display too.
type MemoryDisplay struct {
	// estimated is a ModelDeployment's status.estimatedMemory.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Estimated string `json:"estimated,omitempty"`
	// measured is a ModelDeployment's status.measuredMemory.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Measured string `json:"measured,omitempty"`
	// reserved is a ModelReplica's spec.memoryReservation.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Reserved string `json:"reserved,omitempty"`
	// resident is a ModelReplica's status.memory.resident.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Resident string `json:"resident,omitempty"`
	// ceiling, used and committed are a MacNode's status.memory figures.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Ceiling string `json:"ceiling,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Used string `json:"used,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Committed string `json:"committed,omitempty"`
}

// Package enginepool is the engine pool of a macfleet node: it decides which models are in
// memory on one Mac, keeps requests and unloads from racing, keeps the Mac under its
// memory ceiling and measures what every unload gave back. It has no Kubernetes imports.
//
// This file holds the seams: a Runner is one engine process serving one model (started
// by a RunnerFactory), a Gauge measures memory. The pool depends only on these
// interfaces; package runnerproc (runner processes) and gauge_*.go implement them
// for real, fakes live in tests.
package enginepool

import (
	"context"
	"net/http"
	"time"

	apiengine "github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
)

// Residency says how a model stays in memory.
type Residency string

const (
	// Resident models are reserved and loaded eagerly; LRU may evict them under pressure.
	Resident Residency = "Resident"
	// Pinned models are like Resident ones but never evicted by LRU or idle timeout.
	Pinned Residency = "Pinned"
	// OnDemand models reserve nothing until loaded, load on first request and unload
	// after their idle timeout or under pressure.
	OnDemand Residency = "OnDemand"
)

// ModelSpec is everything the pool needs to know to load one model.
type ModelSpec struct {
	// Name is the served model name (the OpenAI "model" field).
	Name string `json:"name"`
	// Aliases are further names the model answers to.
	Aliases []string `json:"aliases,omitempty"`
	// Path is the local GGUF file.
	Path string `json:"path"`
	// ProjectorPath is the local file of the model's multimodal projector (mmproj),
	// which the runner answers images with (--mmproj); empty for none.
	ProjectorPath string `json:"projectorPath,omitempty"`
	// DraftPath is the local file of the model's draft model for speculative
	// decoding (--draft, docs/speculative-decoding.md); empty for none.
	DraftPath string `json:"draftPath,omitempty"`
	// Namespace is the tenant the model serves: the namespace of its replica in a
	// fleet, empty (DefaultNamespace) for `macfleet serve`. Prompt cache directories
	// are per namespace and model file, so one tenant's runner never restores
	// another's prompts.
	Namespace string `json:"namespace,omitempty"`
	// Engine is the model's engine settings as the API and `macfleet serve` give
	// them: ContextLength is one slot's (the engine holds Engine.TotalContext()
	// tokens), Threads 0 leaves them to the factory (ProcessConfig.Threads, else the
	// thread policy: engine.Settings.WithRunnerThreads).
	Engine    apiengine.Settings `json:"engine"`
	Residency Residency          `json:"residency"`
	// IdleTimeout unloads an idle OnDemand model; zero means the pool default.
	IdleTimeout time.Duration `json:"idleTimeout,omitempty"`
	// EstimatedBytes is the memory the model is expected to take once loaded; it is
	// reserved in the pool's committed account from before the runner starts until
	// after its memory has settled on unload.
	EstimatedBytes int64 `json:"estimatedBytes"`
	// WeightBytes are the model's weights, read from its file: the thread policy
	// gives a small model one thread. 0 when unknown.
	WeightBytes int64 `json:"weightBytes,omitempty"`
	// Dims are the model's dimensions, used by the prefill guard.
	Dims ModelDims `json:"dims"`
	// PromptCache configures the runner's prompt cache (hot and SSD tiers).
	PromptCache PromptCacheSpec `json:"promptCache"`
	// SplitWorker makes the entry a worker shard of a replica split across Macs
	// (docs/split-model.md): the factory starts `macfleet-runner worker` on loopback
	// for Path instead of a runner. It holds EstimatedBytes in the committed account,
	// is measured, enforced and unloaded like a runner, but serves no request: its
	// only client is the head's runner, through the agent's split link.
	SplitWorker bool `json:"splitWorker,omitempty"`
	// SplitNext, for a SplitWorker entry whose shard is followed by another worker
	// shard, is the loopback HOST:PORT of the agent's peer link to that shard's Mac
	// (--next): the worker pushes its layers' output there instead of through the
	// head's runner. Empty for the last worker shard.
	SplitNext string `json:"splitNext,omitempty"`
	// SplitWorkers make the entry the head of a replica split across Macs: its runner
	// keeps the first layers and connects to each worker, in layer order, for the
	// last layers (--split-worker, --split-layers). The addresses are loopback ones
	// of the agent's split link; such a runner is never adopted or detached (the
	// addresses end with the agent) and its sandbox lets it connect to loopback.
	SplitWorkers []SplitWorker `json:"splitWorkers,omitempty"`
}

// SplitWorker is one worker shard a split head's runner computes layers on.
type SplitWorker struct {
	// Addr is the loopback HOST:PORT the runner connects to.
	Addr string `json:"addr"`
	// Layers is how many of the model's blocks the worker computes.
	Layers int `json:"layers"`
	// Token, when set, opens every connection to Addr (the agent's split link
	// requires it); the runner reads it on its standard input, never its arguments.
	Token []byte `json:"-"`
}

// PromptCacheSpec is one model's prompt cache settings. The agent's own settings
// (Config.PromptCacheHotBytes, runnerproc.ProcessConfig.PromptCacheDir and PromptCacheSSDBytes)
// bound them: a model narrows what the agent allows, never widens it.
type PromptCacheSpec struct {
	// Enabled turns the prompt cache on for the model's runners.
	Enabled bool `json:"enabled"`
	// HotBytes caps the model's share of the agent's hot budget: 0 no cap of its own,
	// negative no hot tier.
	HotBytes int64 `json:"hotBytes,omitempty"`
	// SSDBytes is the model's SSD quota: 0 the agent's per-model quota, positive at
	// most that, negative no SSD tier.
	SSDBytes int64 `json:"ssdBytes,omitempty"`
}

// ModelDims are the GGUF dimensions the prefill guard needs.
type ModelDims struct {
	Layers     int     `json:"layers"`
	Embedding  int     `json:"embedding"`
	Heads      int     `json:"heads"`
	KVHeads    int     `json:"kvHeads"`
	Vocab      int     `json:"vocab"`
	KVTypeSize float64 `json:"kvTypeSize"` // bytes per KV element (2 for f16)
}

// RunnerStatus is a runner's own report: the wire type of GET /status
// (docs/runner-protocol.md), not a copy of it.
type RunnerStatus = runnerapi.Status

// Limits are pushed to every runner on every enforcer poll (POST /limits): the
// runner's own ceiling (its reservation and hot share), past which it refuses prefill
// that would take its footprint over it; the host's hard watermark; and the host
// usage the enforcer measured at this poll.
type Limits = runnerapi.Limits

// CacheClearResult is a runner's answer to a prompt-cache clear.
type CacheClearResult struct {
	BytesReclaimed int64 `json:"bytes_reclaimed"`
	EntriesCleared int   `json:"entries_cleared"`
}

// Runner is one engine process serving one model.
type Runner interface {
	// WaitReady blocks until the runner has loaded its model (nil), failed or exited
	// (an error), or ctx ends.
	WaitReady(ctx context.Context) error
	// Client is an HTTP client whose transport reaches the runner (unix socket or
	// loopback); requests go to BaseURL()+path.
	Client() *http.Client
	BaseURL() string
	Status(ctx context.Context) (RunnerStatus, error)
	SetLimits(ctx context.Context, l Limits) error
	// Abort ends every in-flight generation at once and returns how many it ended.
	Abort(ctx context.Context) (int, error)
	ClearCache(ctx context.Context) (CacheClearResult, error)
	// SetCacheBudget is POST /cache/budget: the hot-tier budget (and SSD quota) the
	// agent gives the runner's prompt cache; absent fields stay as they are.
	SetCacheBudget(ctx context.Context, b runnerapi.CacheBudget) (runnerapi.CacheBudgetResult, error)
	// Stop asks for a graceful shutdown, escalates to SIGTERM and then SIGKILL after
	// grace, and returns once the process has been reaped. Idempotent.
	Stop(ctx context.Context, grace time.Duration) error
	// PID is the process id, for measuring the runner from outside.
	PID() int
	// Exited is closed when the process has exited for any reason; ExitErr says why
	// (nil after a requested stop).
	Exited() <-chan struct{}
	ExitErr() error
}

// Detacher is a Runner that can outlive its pool. Detach lets go of the process
// without stopping it, so the next agent can adopt it; it reports false when the
// runner cannot be left running (it was not started detached, or it is stopping or
// gone), and the caller then stops it as usual.
type Detacher interface {
	Detach() bool
}

// RunnerFactory starts runners. ceilingBytes is the runner's own memory ceiling.
type RunnerFactory interface {
	Start(ctx context.Context, spec ModelSpec, ceilingBytes int64) (Runner, error)
}

// HostMemory is one sample of the host's memory.
type HostMemory struct {
	// TotalBytes is the physical (unified) memory.
	TotalBytes int64
	// UsedBytes is memory in use by everything on the host (total - available).
	UsedBytes int64
	// AvailableBytes is what the OS reports could be handed out without swapping.
	AvailableBytes int64
}

// Hardware is what bounds the pool on this machine. Zero means "absent".
type Hardware struct {
	TotalBytes int64
	// MetalWorkingSetBytes is the Metal recommended max working set (darwin only).
	MetalWorkingSetBytes int64
	// WiredLimitBytes is iogpu.wired_limit_mb when set (darwin only).
	WiredLimitBytes int64
	Chip            string
	CPUCores        int
	GPUCores        int
}

// Gauge measures memory. Implementations: gauge_linux.go (/proc), gauge_darwin.go
// (sysctl, host_statistics64, proc_pid_rusage via purego), fakes in tests.
type Gauge interface {
	Hardware() (Hardware, error)
	Host() (HostMemory, error)
	// Process is a process's footprint: smaps_rollup Rss (Pss when shared pages
	// matter) on Linux, phys_footprint on darwin.
	Process(pid int) (int64, error)
}

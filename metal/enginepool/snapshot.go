package enginepool

import (
	"slices"
	"strings"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// Snapshot is everything the agent's status API, metrics and the MacNode and
// ModelReplica statuses need, taken under one lock.
type Snapshot struct {
	Time    time.Time `json:"time"`
	Ceiling Ceiling   `json:"ceiling"`
	// UsageBytes is the enforcer's last measurement: runner footprints plus the
	// agent's own (AgentBytes).
	UsageBytes int64 `json:"usageBytes"`
	AgentBytes int64 `json:"agentBytes"`
	// CommittedBytes is the sum of reservations of engines loading or loaded.
	CommittedBytes  int64         `json:"committedBytes"`
	Pressure        PressureLevel `json:"pressure"`
	LastPoll        time.Time     `json:"lastPoll,omitzero"`
	Loads           int64         `json:"loads"`
	LoadFailures    int64         `json:"loadFailures"`
	Crashes         int64         `json:"crashes"`
	Unloads         int64         `json:"unloads"`
	Evictions       int64         `json:"evictions"`
	FreedBytesTotal int64         `json:"freedBytesTotal"`
	// Runners counts runner processes not yet reaped (including ones whose model
	// was removed while they drain).
	Runners int             `json:"runners"`
	Models  []ModelSnapshot `json:"models"`
}

// ModelSnapshot is one model's part of a Snapshot.
type ModelSnapshot struct {
	Name      string    `json:"name"`
	Aliases   []string  `json:"aliases,omitempty"`
	Residency Residency `json:"residency"`
	State     State     `json:"state"`
	// Spec is the desired spec; LoadedSpec the one the running engine was started
	// with. PendingRestart says they differ in a field that needs a reload.
	Spec           ModelSpec  `json:"spec"`
	LoadedSpec     *ModelSpec `json:"loadedSpec,omitempty"`
	PendingRestart bool       `json:"pendingRestart,omitempty"`
	// Leases held now. A request is active exactly while it holds its lease, so
	// this is also the number of active requests.
	Leases         int `json:"leases"`
	ActiveRequests int `json:"activeRequests"`
	// Requests is the number of leases handed out by the current engine.
	Requests int64 `json:"requests"`
	// LeaseSeconds is the integral of Leases over time since the engine loaded
	// (LoadedAt), up to the snapshot's Time: its growth between two snapshots of one
	// engine, over the time between them, is the mean number of active requests in
	// between, however short each request was. The autoscaler measures load with it.
	LeaseSeconds   float64       `json:"leaseSeconds"`
	EstimatedBytes int64         `json:"estimatedBytes"`
	ReservedBytes  int64         `json:"reservedBytes"`
	ResidentBytes  int64         `json:"residentBytes"`
	PeakBytes      int64         `json:"peakBytes"`
	PID            int           `json:"pid,omitempty"`
	LoadedAt       time.Time     `json:"loadedAt,omitzero"`
	LastUsed       time.Time     `json:"lastUsed,omitzero"`
	IdleTimeout    time.Duration `json:"idleTimeout,omitempty"`
	LastUnload     *UnloadReport `json:"lastUnload,omitempty"`
	Failures       int           `json:"failures,omitempty"`
	FailureReason  string        `json:"failureReason,omitempty"`
	RetryAt        time.Time     `json:"retryAt,omitzero"`
	LastError      string        `json:"lastError,omitempty"`
	// Retired: Retire was called; the model refuses requests and stays unloaded.
	Retired bool `json:"retired,omitempty"`
	// PromptCache is the latest prompt cache report of the model's runner (kept
	// after an unload); absent when its cache is disabled or it never reported.
	PromptCache *PromptCacheStats `json:"promptCache,omitempty"`
	// Chat is how the loaded engine renders chat prompts: its renderer (the model's
	// own Jinja template or llama.cpp's built-in ones) and tool-call format.
	Chat *runnerapi.ChatInfo `json:"chat,omitempty"`
	// Split is the loaded runner's latest report of its links to the worker shards,
	// when it is a split replica's head.
	Split *SplitStats `json:"split,omitempty"`
	// Off lists the paths the model's runner serves it without, each with its reason
	// (runnerapi.PathOff: the prompt cache of a model that keeps a recurrent state),
	// as its latest runner reported them (kept after an unload); absent when it
	// serves every path or never reported.
	Off []runnerapi.PathOff `json:"off,omitempty"`
}

// Snapshot returns the pool's state. Models are sorted by name.
func (p *Pool) Snapshot() Snapshot { return p.st.snapshot() }

// snapshot is Snapshot, read under one lock.
func (st *state) snapshot() Snapshot {
	st.mu.Lock()
	defer st.mu.Unlock()
	s := Snapshot{
		Time: st.clock.Now(), Ceiling: st.ceiling, UsageBytes: st.usage, AgentBytes: st.agentBytes,
		CommittedBytes: st.committed, Pressure: st.level, LastPoll: st.lastPoll,
		Loads: st.loads, LoadFailures: st.loadFailures, Crashes: st.crashes, Unloads: st.unloads,
		Evictions: st.evictions, FreedBytesTotal: st.freedTotal, Runners: 0,
	}
	for g := range st.engines {
		if g.runner != nil {
			s.Runners++
		}
	}
	for _, e := range st.entries {
		m := ModelSnapshot{
			Name: e.spec.Name, Aliases: slices.Clone(e.spec.Aliases), Residency: e.spec.Residency,
			State: e.state, Spec: e.spec, EstimatedBytes: e.spec.EstimatedBytes, LastUsed: e.lastUsed,
			IdleTimeout: e.idleTimeout(st.cfg.IdleTimeout), Failures: e.failures, FailureReason: e.failReason,
			Retired: e.retired, Off: slices.Clone(e.lastOff),
		}
		m.Spec.Aliases = slices.Clone(e.spec.Aliases)
		if e.state == StateFailed {
			m.RetryAt = e.retryAt
		}
		if e.lastErr != nil {
			m.LastError = e.lastErr.Error()
		}
		if e.lastUnload != nil {
			r := *e.lastUnload
			m.LastUnload = &r
		}
		if c := e.lastCache; c != nil {
			pc := *c
			if g := e.eng; g != nil {
				pc.HotShareBytes = g.hotShare
			} else {
				pc.HotShareBytes = 0
			}
			m.PromptCache = &pc
		}
		if g := e.eng; g != nil {
			m.Chat, m.Split = g.chat, g.split
			loaded := g.spec
			loaded.Aliases = slices.Clone(g.spec.Aliases)
			m.LoadedSpec = &loaded
			m.PendingRestart = needsRestart(g.spec, e.spec)
			m.Leases, m.ActiveRequests, m.Requests = g.inUse, g.inUse, g.requests
			m.LeaseSeconds = g.leaseSecondsAt(s.Time)
			m.ReservedBytes, m.ResidentBytes, m.PeakBytes = g.reservation, g.footprint, g.peak
			m.PID, m.LoadedAt = g.pid, g.loadedAt
		}
		s.Models = append(s.Models, m)
	}
	slices.SortFunc(s.Models, func(a, b ModelSnapshot) int { return strings.Compare(a.Name, b.Name) })
	return s
}

// needsRestart says whether moving from a to b changes the engine itself.
func needsRestart(a, b ModelSpec) bool {
	return engineIdentityOf(a) != engineIdentityOf(b)
}

// engineIdentity is every field of a ModelSpec a running engine depends on: a change
// of any of them needs a new runner. The process factory fingerprints it to decide
// whether a recorded runner may be adopted (with the runner's flags, so that a new
// engine setting is in the fingerprint through engine.Settings.Args). The engine
// settings are spelled out, as recorded runners' fingerprints have hashed them:
// TestEngineIdentityCoversEverySetting fails on a setting left out.
type engineIdentity struct {
	Path string `json:"path"`
	// ContextLength is the engine's total context (every slot's), as the
	// fingerprints of recorded runners have always hashed it.
	ContextLength  int             `json:"contextLength"`
	Parallel       int             `json:"parallel"`
	KVCacheType    string          `json:"kvCacheType"`
	EstimatedBytes int64           `json:"estimatedBytes"`
	Dims           ModelDims       `json:"dims"`
	PromptCache    PromptCacheSpec `json:"promptCache"`
	// SplitPipeline is a split head's llama contexts (0: unset), omitted when unset so
	// that the fingerprints of runners recorded before it stay the same.
	SplitPipeline int `json:"splitPipeline,omitempty"`
	// Namespace picks the prompt cache directory.
	Namespace string `json:"namespace,omitempty"`
}

func engineIdentityOf(s ModelSpec) engineIdentity {
	return engineIdentity{Path: s.Path, ContextLength: s.Engine.TotalContext(), Parallel: int(s.Engine.Parallel),
		KVCacheType: string(s.Engine.KVCacheType), EstimatedBytes: s.EstimatedBytes, Dims: s.Dims, PromptCache: s.PromptCache,
		SplitPipeline: int(s.Engine.SplitPipeline), Namespace: s.Namespace}
}

// EngineIdentity is the engine identity of s (every field a running engine depends
// on) as a value to fingerprint: the process factory hashes it to decide whether a
// recorded runner may be adopted.
func EngineIdentity(s ModelSpec) any { return engineIdentityOf(s) }

// Package cachestats reads the console's prompt cache figures: the counters of each
// Ready replica's runner as its agent reports them, summed per deployment.
package cachestats

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/console"
	"github.com/macfleet/macfleet/gateway/prefixindex"
)

// The console's prompt cache figures: the counters of each Ready replica's runner as
// its agent reports them on GET /api/status (per model, under promptCache; read from
// the runners when asked), summed per deployment. The console asks when it renders a
// page; an agent's answer is reused for cacheStatsTTL and a page waits at most
// cacheStatsTimeout for an agent.
const (
	cacheStatsTTL     = 5 * time.Second
	cacheStatsTimeout = 2 * time.Second
	// maxStatusBytes bounds an agent's /api/status answer.
	maxStatusBytes = 8 << 20
)

// agentStatus is the part of an agent's GET /api/status the console uses: per model
// (the replica's key), its runner's prompt cache counters (absent until it loaded).
type agentStatus struct {
	Models []modelStatus `json:"models"`
	// PeerFetches are the agent's fetches of prompt states from other Macs, by model
	// (peer fetch).
	PeerFetches map[string]agentPeerFetches `json:"peerFetches"`
}

type agentPeerFetches struct {
	Bytes   int64            `json:"bytes"`
	Results map[string]int64 `json:"results"`
}

type modelStatus struct {
	Name        string            `json:"name"`
	PromptCache *runnerCacheStats `json:"promptCache"`
}

// runnerCacheStats are the counters of a runner's prompt cache the console shows
// (docs/prompt-cache.md, "Counters"): hits is the SSD tier's.
type runnerCacheStats struct {
	HotHits        int64 `json:"hotHits"`
	HotMisses      int64 `json:"hotMisses"`
	Hits           int64 `json:"hits"`
	RestoredTokens int64 `json:"restoredTokens"`
}

// counters is s's prompt cache counters by model.
func (s agentStatus) counters() map[string]console.PromptCache {
	out := map[string]console.PromptCache{}
	for _, m := range s.Models {
		if pc := m.PromptCache; pc != nil {
			out[m.Name] = console.PromptCache{HotHits: pc.HotHits, HotMisses: pc.HotMisses, SSDHits: pc.Hits,
				RestoredTokens: pc.RestoredTokens, Replicas: 1}
		}
	}
	for name, pf := range s.PeerFetches {
		if c, ok := out[name]; ok {
			c.PeerBytes, c.PeerFetches = pf.Bytes, pf.Results
			out[name] = c
		}
	}
	return out
}

// sumPromptCache is the deployments' prompt cache counters (by "<namespace>/<name>")
// from their Ready replicas' (byAgent: each agent's counters by model, by endpoint; an
// agent that did not answer is absent). A replica whose agent did not answer counts
// as unreported; one whose runner reports no counters (not loaded yet, no cache) adds
// nothing. An agent names a replica's model "<namespace>/<replica>" (cluster mode) or,
// run as `macfleet serve`, by the deployment's name.
func sumPromptCache(replicas []mfv1.ModelReplica, byAgent map[string]map[string]console.PromptCache) map[string]console.PromptCache {
	out := map[string]console.PromptCache{}
	for _, r := range replicas {
		if r.Status.Endpoint == "" || !meta.IsStatusConditionTrue(r.Status.Conditions, mfv1.ReplicaReady) {
			continue
		}
		dep := r.Namespace + "/" + r.Labels[mfv1.LabelDeployment]
		models, answered := byAgent[r.Status.Endpoint]
		if !answered {
			out[dep] = out[dep].Add(console.PromptCache{Unreported: 1})
			continue
		}
		// An agent in cluster mode names the model by the replica; one run as
		// `macfleet serve` behind the gateway by the model's own name, the deployment's.
		pc, ok := models[r.Namespace+"/"+r.Name]
		if !ok {
			pc, ok = models[r.Labels[mfv1.LabelDeployment]]
		}
		if ok {
			out[dep] = out[dep].Add(pc)
		}
	}
	return out
}

// Stats reads and keeps the agents' counters for the console.
type Stats struct {
	fetch func(ctx context.Context, t prefixindex.Target) (agentStatus, error)
	now   func() time.Time

	mu     sync.Mutex
	agents map[string]agentCounters // by endpoint
}

type agentCounters struct {
	at     time.Time
	models map[string]console.PromptCache
}

// New is the console's prompt cache figures, read from the agents through h.
func New(h HTTPFetch) *Stats { return &Stats{fetch: h.fetch, now: time.Now} }

// Read is the deployments' prompt cache counters (by "<namespace>/<name>") from
// replicas, asking the agents whose last answer is older than cacheStatsTTL
// (concurrently, each for at most cacheStatsTimeout).
func (c *Stats) Read(ctx context.Context, replicas []mfv1.ModelReplica) map[string]console.PromptCache {
	now := c.now()
	byAgent := map[string]map[string]console.PromptCache{}
	ask := map[string]prefixindex.Target{}
	c.mu.Lock()
	for _, r := range replicas {
		ep := r.Status.Endpoint
		if ep == "" {
			continue
		}
		if a, ok := c.agents[ep]; ok && now.Sub(a.at) < cacheStatsTTL {
			byAgent[ep] = a.models
		} else {
			ask[ep] = prefixindex.Target{Key: r.Namespace + "/" + r.Name, Endpoint: ep, Node: r.Spec.NodeName}
		}
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, cacheStatsTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for ep, t := range ask {
		wg.Go(func() {
			st, err := c.fetch(ctx, t)
			if err != nil {
				return
			}
			mu.Lock()
			byAgent[ep] = st.counters()
			mu.Unlock()
		})
	}
	wg.Wait()
	c.mu.Lock()
	if c.agents == nil {
		c.agents = map[string]agentCounters{}
	}
	for ep := range ask {
		if m, ok := byAgent[ep]; ok {
			c.agents[ep] = agentCounters{at: now, models: m}
		}
	}
	c.mu.Unlock()
	return sumPromptCache(replicas, byAgent)
}

// HTTPFetch asks agents for their status over HTTP.
type HTTPFetch struct {
	Transport http.RoundTripper
	// Scheme is "http://" or "https://".
	Scheme string
	// Prepare readies a request for t's agent (credentials, the Mac whose certificate
	// the connection must present) and returns it.
	Prepare func(r *http.Request, t prefixindex.Target) *http.Request
}

// fetch is GET /api/status of t's agent.
func (h HTTPFetch) fetch(ctx context.Context, t prefixindex.Target) (agentStatus, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.Scheme+t.Endpoint+"/api/status", nil)
	if err != nil {
		return agentStatus{}, err
	}
	resp, err := h.Transport.RoundTrip(h.Prepare(req, t))
	if err != nil {
		return agentStatus{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return agentStatus{}, fmt.Errorf("agent answered %d", resp.StatusCode)
	}
	var st agentStatus
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStatusBytes)).Decode(&st); err != nil {
		return agentStatus{}, fmt.Errorf("reading the agent's status: %w", err)
	}
	return st, nil
}

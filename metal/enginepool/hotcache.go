package enginepool

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// The hot tier of the prompt cache lives in the runners' memory. The agent has one
// hot budget (Config.PromptCacheHotBytes) that the pool shares out among the Ready
// runners whose model enables the cache, equally, each capped by its model's own
// hotBytes, and moves when models load and unload. A share counts in its runner's
// own ceiling (runnerCeiling + share), and the budget handed out is bounded by what
// the reservations leave below the soft watermark, so hot tiers never push the Mac
// into pressure by themselves. Under hard pressure every share drops to zero (the
// runners free their hot tiers) before the enforcer aborts any request; the shares
// come back once pressure is ok again.
//
// Shares are decided and pushed (POST /cache/budget) by the enforcer's poll, which
// loads, unloads and pressure changes wake: one goroutine, so pushes never overtake
// each other. Decreases are pushed, and answered, before increases, so the runners
// together never hold more than the budget.

// DefaultPromptCacheHotFraction is the agent's default hot budget as a fraction of
// the memory ceiling.
const DefaultPromptCacheHotFraction = 0.10

// PromptCacheStats is a runner's prompt cache report, in /api/status per model.
type PromptCacheStats struct {
	Enabled bool `json:"enabled"`
	// HotShareBytes is the share of the agent's hot budget the pool gives the runner;
	// HotBudgetBytes the budget the runner last confirmed (it follows the share).
	HotShareBytes  int64 `json:"hotShareBytes"`
	HotBudgetBytes int64 `json:"hotBudgetBytes"`
	// Hot tier contents and counters.
	HotBytes     int64 `json:"hotBytes"`
	HotEntries   int   `json:"hotEntries"`
	HotHits      int64 `json:"hotHits"`
	HotMisses    int64 `json:"hotMisses"`
	HotEvictions int64 `json:"hotEvictions"`
	// HotRejected counts states larger than the runner's whole hot budget: kept by the
	// SSD tier alone (or by no tier without one). Rising on a Mac with many replicas
	// says their shares of the budget are smaller than one conversation's state.
	HotRejected int64 `json:"hotRejected"`
	// Restores counts states restored into a slot; RestoredTokens the prompt tokens
	// they spared from prefill.
	Restores       int64 `json:"restores"`
	RestoredTokens int64 `json:"restoredTokens"`
	// InflightShares counts requests that took the KV of a prefix another slot was
	// prefilling instead of prefilling it again (also counted in Restores),
	// InflightSharedTokens the prompt tokens that spared.
	InflightShares       int64 `json:"inflightShares"`
	InflightSharedTokens int64 `json:"inflightSharedTokens"`
	// SSD tier (absent counters are zero when the runner has no SSD tier): its
	// directory, contents, effective quota and the counters of ENGINE_POOL.md.
	SSDDir          string `json:"ssdDir,omitempty"`
	SSDBytes        int64  `json:"ssdBytes"`
	SSDEntries      int    `json:"ssdEntries"`
	SSDQuotaBytes   int64  `json:"ssdQuotaBytes"`
	Saves           int64  `json:"saves"`
	SavesPersisted  int64  `json:"savesPersisted"`
	Errors          int64  `json:"errors"`
	Hits            int64  `json:"hits"`
	Misses          int64  `json:"misses"`
	Evictions       int64  `json:"evictions"`
	UnlinkFailures  int64  `json:"unlinkFailures"`
	InlineFallbacks int64  `json:"inlineFallbacks"`
}

func promptCacheStats(st *runnerapi.PromptCacheStatus) *PromptCacheStats {
	if st == nil {
		return nil
	}
	s := &PromptCacheStats{
		HotBytes: st.Hot.Bytes, HotEntries: st.Hot.Entries, HotHits: st.Hot.Hits, HotMisses: st.Hot.Misses,
		HotEvictions: st.Hot.Evictions, HotRejected: st.Hot.Rejected, HotBudgetBytes: st.Hot.BudgetBytes,
		Restores: st.Restores, RestoredTokens: st.RestoredTokens, SSDDir: st.Dir,
		InflightShares: st.InflightShares, InflightSharedTokens: st.InflightSharedTokens,
	}
	if d := st.SSD; d != nil {
		s.SSDBytes, s.SSDEntries, s.SSDQuotaBytes = d.Bytes, d.Entries, d.QuotaBytes
		s.Saves, s.SavesPersisted, s.Errors, s.Hits, s.Misses = d.Saves, d.SavesPersisted, d.Errors, d.Hits, d.Misses
		s.Evictions, s.UnlinkFailures, s.InlineFallbacks = d.Evictions, d.UnlinkFailures, d.InlineFallbacks
	}
	return s
}

// hotBudget pushes the hot shares the state planned (state.hotPlan) to the runners
// and records what each confirmed.
type hotBudget struct {
	deps
	st *state
}

// budget is the agent's hot budget: the configured one (or the default fraction of
// the ceiling), bounded by what the reservations leave below the soft watermark, and
// zero while pressure keeps the hot tiers shrunk.
func (s *state) hotBudget() int64 {
	if s.hotShrunk {
		return 0
	}
	return max(0, min(s.hotConfigured(), s.ceiling.SoftBytes-s.committed))
}

// PromptCacheHotBudget is the agent's hot budget as configured (before the bound of
// the reservations and pressure).
func (p *Pool) PromptCacheHotBudget() int64 { return p.st.view(query{}).hotBudget }

// RefreshPromptCacheStats reads the prompt cache report of every live runner whose
// model enables the cache, and the link report of every split head's, for the next
// Snapshot (the enforcer does it every poll).
// Each runner is asked with the pool's RunnerCallTimeout.
func (p *Pool) RefreshPromptCacheStats() { p.meter.statuses() }

// hotCandidate says whether g gets a share: Ready, not being torn down, its model
// enabling a hot tier and its runner serving the model with its prompt cache (a
// runner that reported the cache off answers every budget 409). The state's lock
// is held.
func hotCandidate(g *engine) bool {
	pc := g.spec.PromptCache
	return pc.Enabled && pc.HotBytes >= 0 && g.runner != nil && !g.tearingDown && !isClosed(g.stopped) && !g.cacheOff() &&
		g.entry.eng == g && g.entry.state == StateReady
}

// shareHot splits budget among wants (each a cap; <= 0 means none): equally, a capped
// one taking at most its cap and leaving the rest to the others. The shares never sum
// to more than budget.
func shareHot(budget int64, caps []int64) []int64 {
	out := make([]int64, len(caps))
	order := make([]int, len(caps))
	for i := range order {
		order[i] = i
	}
	capOf := func(i int) int64 {
		if caps[i] <= 0 {
			return math.MaxInt64
		}
		return caps[i]
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ca, cb := capOf(a), capOf(b)
		switch {
		case ca < cb:
			return -1
		case ca > cb:
			return 1
		}
		return 0
	})
	left := max(budget, 0)
	for n, i := range order {
		share := min(capOf(i), left/int64(len(order)-n))
		out[i] = share
		left -= share
	}
	return out
}

// budgetPush is one POST /cache/budget the poll sends.
type budgetPush struct {
	g    *engine
	name string
	r    Runner
	hot  int64
}

// hotPlan decides every runner's share and returns the pushes to send:
// decreases and increases separately. A runner that is draining keeps its budget
// (its hot tier goes with it, and a cache clear still reaches it) unless pressure
// shrinks every tier; its budget stays counted until its process is gone.
func (s *state) hotPlan() (decreases, increases []budgetPush) {
	var cands []*engine
	held := int64(0)
	for g := range s.engines {
		if !g.spec.PromptCache.Enabled || g.runner == nil {
			continue
		}
		if hotCandidate(g) {
			cands = append(cands, g)
			continue
		}
		g.hotShare = 0
		if g.hotBudget > 0 {
			if s.hotShrunk && !isClosed(g.stopped) {
				decreases = append(decreases, budgetPush{g, g.name, g.runner, 0})
			}
			held += g.hotBudget
		}
	}
	slices.SortFunc(cands, func(a, b *engine) int { return strings.Compare(a.name, b.name) })
	caps := make([]int64, len(cands))
	for i, g := range cands {
		caps[i] = g.spec.PromptCache.HotBytes
	}
	shares := shareHot(s.hotBudget()-held, caps)
	for i, g := range cands {
		g.hotShare = shares[i]
		switch {
		case g.hotBudget == g.hotShare:
		case g.hotBudget >= 0 && g.hotShare > g.hotBudget:
			increases = append(increases, budgetPush{g, g.name, g.runner, g.hotShare})
		default: // a decrease, or a runner whose budget is not known (just loaded or adopted)
			decreases = append(decreases, budgetPush{g, g.name, g.runner, g.hotShare})
		}
	}
	return decreases, increases
}

// push sends pushes concurrently and records what each runner confirmed.
func (h hotBudget) push(pushes []budgetPush) {
	var wg sync.WaitGroup
	for _, ps := range pushes {
		h.clock.goCall(&wg, h.cfg.RunnerCallTimeout, "setting the cache budget of "+ps.name, func(ctx context.Context) {
			hot := ps.hot
			res, err := ps.r.SetCacheBudget(ctx, runnerapi.CacheBudget{HotBytes: &hot})
			if err != nil {
				h.log.V(2).Info("Setting the prompt cache budget failed", "model", ps.name, "hotBytes", hot, "err", err.Error())
				return
			}
			h.st.record(measurement{kind: measuredBudget, g: ps.g, hotBudget: res.HotBytes})
			if res.EvictedBytes > 0 {
				h.log.V(2).Info("Prompt cache hot tier shrunk", "model", ps.name, "hotBytes", res.HotBytes,
					"evictedBytes", res.EvictedBytes, "evictedEntries", res.EvictedEntries)
			}
		})
	}
	wg.Wait()
}

// hotHeld sums the hot-tier bytes the runners last reported: what shrinking every
// hot tier gives back.
func (s *state) hotHeld() int64 {
	var sum int64
	for g := range s.engines {
		if g.cache != nil && !g.tearingDown {
			sum += g.cache.HotBytes
		}
	}
	return sum
}

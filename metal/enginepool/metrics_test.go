package enginepool

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testenv"
)

func TestMetricsExportPoolStateAndEvents(t *testing.T) {
	h := newHarness(t, Config{})
	m := NewMetrics(h.p)
	h.register("a", 6, OnDemand)
	h.register("b", 6, OnDemand)
	h.load("a")
	h.load("b") // evicts a
	h.p.enforcer.poll()
	// Observers hear of a load just after its waiters are woken, and of an unload after
	// it settles: wait for the second load and the eviction's unload.
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() (bool, string) {
		n := testutil.ToFloat64(m.loads.WithLabelValues("ok"))
		u := testutil.ToFloat64(m.unloads.WithLabelValues(string(ReasonEviction), string(Settled)))
		return n == 2 && u == 1, fmt.Sprintf("%v loads and %v eviction unloads counted", n, u)
	})

	if problems, err := testutil.CollectAndLint(m); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
	const want = `
# HELP macfleet_agent_evictions_total Models unloaded to make room or under memory pressure.
# TYPE macfleet_agent_evictions_total counter
macfleet_agent_evictions_total 1
# HELP macfleet_agent_loads_total Model load attempts by result (ok, failed, refused: admission said no or the load was canceled).
# TYPE macfleet_agent_loads_total counter
macfleet_agent_loads_total{result="ok"} 2
# HELP macfleet_agent_memory_ceiling_bytes The pool's memory ceiling, labelled with the bound that sets it.
# TYPE macfleet_agent_memory_ceiling_bytes gauge
macfleet_agent_memory_ceiling_bytes{bound="configured"} 1.073741824e+10
# HELP macfleet_agent_memory_committed_bytes Reservations of engines loading or loaded.
# TYPE macfleet_agent_memory_committed_bytes gauge
macfleet_agent_memory_committed_bytes 6.442450944e+09
# HELP macfleet_agent_model_leases Leases (active requests) held on each model's engine.
# TYPE macfleet_agent_model_leases gauge
macfleet_agent_model_leases{model="a"} 0
macfleet_agent_model_leases{model="b"} 0
# HELP macfleet_agent_unload_freed_bytes_total Bytes given back by every unload.
# TYPE macfleet_agent_unload_freed_bytes_total counter
macfleet_agent_unload_freed_bytes_total 6.442450944e+09
# HELP macfleet_agent_unloads_total Engines stopped, by reason and settle outcome.
# TYPE macfleet_agent_unloads_total counter
macfleet_agent_unloads_total{outcome="Settled",reason="eviction"} 1
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want),
		MetricEvictions, MetricLoads, MetricMemoryCeiling, MetricMemoryCommitted, MetricModelLeases,
		MetricFreedBytesTotal, MetricUnloads); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m, MetricModelState); n != 2*len(allStates) {
		t.Fatalf("%d state series, want one per model and state", n)
	}
}

// Each model's prompt cache counters and tier sizes are exported per model, from its
// runner's report.
func TestMetricsExportPromptCacheCounters(t *testing.T) {
	h := newHarness(t, Config{PromptCacheHotBytes: gib})
	m := NewMetrics(h.p)
	h.registerCached("c", 1, OnDemand, 0)
	h.register("off", 1, OnDemand)
	h.load("c")
	h.load("off")
	r := h.f.last(t, "c")
	r.mu.Lock()
	r.ssd = &runnerapi.PromptCacheSSD{Saves: 7, SavesPersisted: 6, Errors: 1, Hits: 3, Misses: 4, Evictions: 5,
		UnlinkFailures: 1, InlineFallbacks: 2, Bytes: 4096}
	r.mu.Unlock()
	h.p.enforcer.poll() // pushes the share, reads the report
	r.fillHot(1000)
	r.rejectHot()
	r.rejectHot()
	h.p.RefreshPromptCacheStats()

	if problems, err := testutil.CollectAndLint(m); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
	var want strings.Builder
	for _, c := range []struct {
		name string
		v    int
	}{{"saves", 7}, {"saves_persisted", 6}, {"errors", 1}, {"hits", 3}, {"misses", 4}, {"evictions", 5},
		{"unlink_failures", 1}, {"inline_fallbacks", 2}, {"hot_rejected", 2}} {
		for _, pc := range promptCacheCounters {
			if pc.name == c.name {
				fmt.Fprintf(&want, "# HELP %s%s_total Prompt cache: %s Counted by the model's current runner.\n", MetricPromptCachePrefix, c.name, pc.help)
			}
		}
		fmt.Fprintf(&want, "# TYPE %s%s_total counter\n%s%s_total{model=\"c\"} %d\n", MetricPromptCachePrefix, c.name, MetricPromptCachePrefix, c.name, c.v)
	}
	names := []string{}
	for _, c := range []string{"saves", "saves_persisted", "errors", "hits", "misses", "evictions", "unlink_failures", "inline_fallbacks", "hot_rejected"} {
		names = append(names, MetricPromptCachePrefix+c+"_total")
	}
	if err := testutil.CollectAndCompare(m, strings.NewReader(want.String()), names...); err != nil {
		t.Fatal(err)
	}
	const gauges = `
# HELP macfleet_agent_prompt_cache_hot_budget_bytes Each model's share of the agent's prompt cache hot budget, as its runner confirmed it.
# TYPE macfleet_agent_prompt_cache_hot_budget_bytes gauge
macfleet_agent_prompt_cache_hot_budget_bytes{model="c"} 1.073741824e+09
# HELP macfleet_agent_prompt_cache_hot_bytes Bytes the prompt cache hot tier of each model's runner holds.
# TYPE macfleet_agent_prompt_cache_hot_bytes gauge
macfleet_agent_prompt_cache_hot_bytes{model="c"} 1000
# HELP macfleet_agent_prompt_cache_ssd_bytes Bytes of each model's prompt cache SSD tier.
# TYPE macfleet_agent_prompt_cache_ssd_bytes gauge
macfleet_agent_prompt_cache_ssd_bytes{model="c"} 4096
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(gauges), MetricPromptCacheBudget, MetricPromptCacheHot, MetricPromptCacheSSD); err != nil {
		t.Fatal(err)
	}
}

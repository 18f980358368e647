package metal

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetricsExportPoolStateAndEvents(t *testing.T) {
	h := newHarness(t, Config{})
	m := NewMetrics(h.p)
	h.register("a", 6, OnDemand)
	h.register("b", 6, OnDemand)
	h.load("a")
	h.load("b") // evicts a
	h.p.poll()

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

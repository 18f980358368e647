package enginepool

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// A split head's link counters are exported per model and worker shard (its index
// among the replica's shards, not the link's address), with the head's own compute
// time; a model whose runner holds every layer has none.
func TestMetricsExportSplitLinks(t *testing.T) {
	h := newHarness(t, Config{})
	m := NewMetrics(h.p)
	head := ModelSpec{Name: "big", Path: "/models/big.gguf", EstimatedBytes: gib,
		SplitWorkers: []SplitWorker{{Addr: "127.0.0.1:40001", Layers: 20}, {Addr: "127.0.0.1:40002", Layers: 30}}}
	if err := h.p.Register(head); err != nil {
		t.Fatal(err)
	}
	h.register("whole", 1, OnDemand)
	h.load("big")
	h.load("whole")
	r := h.f.last(t, "big")
	r.mu.Lock()
	r.split = []runnerapi.SplitWorkerStatus{
		{Addr: "127.0.0.1:40001", Layers: 20, FirstLayer: 10, BytesSent: 10240, BytesReceived: 4096, RoundTrips: 12, Computes: 11,
			LinkWaitSeconds: 1.5, WorkerComputeSeconds: 1.25, AllocatedBytes: 5 * gib, PeerLink: true, PeerBytesSent: 3072},
		{Addr: "127.0.0.1:40002", Layers: 30, FirstLayer: 30, BytesSent: 20480, BytesReceived: 8192, RoundTrips: 13, Computes: 12,
			LinkWaitSeconds: 2.5, WorkerComputeSeconds: 2, AllocatedBytes: 7 * gib},
	}
	r.splitHead = 0.75
	r.mu.Unlock()
	h.p.RefreshPromptCacheStats()

	if problems, err := testutil.CollectAndLint(m); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
	var want strings.Builder
	var names []string
	values := map[string][2]string{
		"sent_bytes": {"10240", "20480"}, "received_bytes": {"4096", "8192"}, "round_trips": {"12", "13"},
		"computes": {"11", "12"}, "link_wait_seconds": {"1.5", "2.5"}, "worker_compute_seconds": {"1.25", "2"},
		"peer_sent_bytes": {"3072", "0"},
	}
	for _, c := range splitCounters {
		name := MetricSplitPrefix + c.name + "_total"
		v, ok := values[c.name]
		if !ok {
			t.Fatalf("no expected value for %s", name)
		}
		names = append(names, name)
		want.WriteString("# HELP " + name + " Split replica: " + c.help +
			" Counted by the model's current runner; shard is the worker's index in the replica's shards.\n")
		want.WriteString("# TYPE " + name + " counter\n")
		want.WriteString(name + `{model="big",shard="1"} ` + v[0] + "\n")
		want.WriteString(name + `{model="big",shard="2"} ` + v[1] + "\n")
	}
	want.WriteString(`# HELP macfleet_agent_split_head_compute_seconds_total Split replica: time the head's runner spent in decode steps minus its link wait (its own layers). Counted by the model's current runner.
# TYPE macfleet_agent_split_head_compute_seconds_total counter
macfleet_agent_split_head_compute_seconds_total{model="big"} 0.75
`)
	names = append(names, MetricSplitHeadCompute)
	if err := testutil.CollectAndCompare(m, strings.NewReader(want.String()), names...); err != nil {
		t.Fatal(err)
	}

	// /api/status has the report under the model, in the same order.
	for _, ms := range h.p.Snapshot().Models {
		switch {
		case ms.Name == "whole" && ms.Split != nil:
			t.Errorf("a model held by one runner reports a split: %+v", ms.Split)
		case ms.Name == "big" && (ms.Split == nil || len(ms.Split.Workers) != 2 || ms.Split.Workers[1].Addr != "127.0.0.1:40002" ||
			ms.Split.HeadComputeSeconds != 0.75):
			t.Errorf("the split head's snapshot: %+v", ms.Split)
		}
	}

	// Unloaded, the model's runner and its counters are gone.
	if _, err := h.p.Unload(h.ctx(), "big"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m, names...); n != 0 {
		t.Errorf("%d split series after the head's runner stopped", n)
	}
}

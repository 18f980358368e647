package enginepool

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// SplitStats is a split head's report of its links to the worker shards
// (docs/split-model.md#metrics-and-traces), in /api/status per model.
type SplitStats struct {
	// HeadComputeSeconds is the time the head's runner spent in decode steps minus the
	// time it waited on its links: its own layers and the output layer.
	HeadComputeSeconds float64 `json:"headComputeSeconds"`
	// Workers are the runner's links, in layer order: Workers[i] is shard i+1 of the
	// replica (shard 0 is the head).
	Workers []runnerapi.SplitWorkerStatus `json:"workers"`
}

// splitStats is st's split report, nil for a runner that holds every layer.
func splitStats(st *RunnerStatus) *SplitStats {
	if len(st.Split) == 0 {
		return nil
	}
	s := &SplitStats{HeadComputeSeconds: st.SplitHeadComputeSeconds}
	s.Workers = append(s.Workers, st.Split...)
	return s
}

// Metric names of a split head's links, per model and worker shard.
const (
	MetricSplitPrefix      = "macfleet_agent_split_"
	MetricSplitHeadCompute = "macfleet_agent_split_head_compute_seconds_total"
)

// splitCounters are a split head's per-link counters exported as
// macfleet_agent_split_<name>_total with the labels model and shard.
var splitCounters = []struct {
	name, help string
	get        func(*runnerapi.SplitWorkerStatus) float64
}{
	{"sent_bytes", "Bytes the head's runner sent the worker shard (framing included).",
		func(w *runnerapi.SplitWorkerStatus) float64 { return float64(w.BytesSent) }},
	{"received_bytes", "Bytes the head's runner received from the worker shard (framing included).",
		func(w *runnerapi.SplitWorkerStatus) float64 { return float64(w.BytesReceived) }},
	{"round_trips", "Answered commands on the link (a decode step takes one per worker).",
		func(w *runnerapi.SplitWorkerStatus) float64 { return float64(w.RoundTrips) }},
	{"computes", "Graphs the worker shard computed.",
		func(w *runnerapi.SplitWorkerStatus) float64 { return float64(w.Computes) }},
	{"link_wait_seconds", "Time the head's runner waited on answered commands (sending, the worker's work, the answer).",
		func(w *runnerapi.SplitWorkerStatus) float64 { return w.LinkWaitSeconds }},
	{"worker_compute_seconds", "The part of the link wait the worker shard spent computing its layers.",
		func(w *runnerapi.SplitWorkerStatus) float64 { return w.WorkerComputeSeconds }},
	{"peer_sent_bytes", "Bytes the worker shard pushed straight to the next worker shard (framing included; 0 for the last).",
		func(w *runnerapi.SplitWorkerStatus) float64 { return float64(w.PeerBytesSent) }},
}

// splitDescs are the descriptions of the split metrics.
type splitDescs struct {
	counters    []*prometheus.Desc
	headCompute *prometheus.Desc
}

func newSplitDescs() splitDescs {
	var d splitDescs
	for _, c := range splitCounters {
		d.counters = append(d.counters, prometheus.NewDesc(MetricSplitPrefix+c.name+"_total",
			"Split replica: "+c.help+" Counted by the model's current runner; shard is the worker's index in the replica's shards.",
			[]string{"model", "shard"}, nil))
	}
	d.headCompute = prometheus.NewDesc(MetricSplitHeadCompute,
		"Split replica: time the head's runner spent in decode steps minus its link wait (its own layers). Counted by the model's current runner.",
		[]string{"model"}, nil)
	return d
}

func (d splitDescs) describe(ch chan<- *prometheus.Desc) {
	for _, c := range d.counters {
		ch <- c
	}
	ch <- d.headCompute
}

// collect exports one model's split report. The shard label is the worker's index
// among the replica's shards (the head is 0), not its address: the head's runner
// reaches its workers at loopback ports of the agent that change with every start.
func (d splitDescs) collect(ch chan<- prometheus.Metric, model string, s *SplitStats) {
	if s == nil {
		return
	}
	for i := range s.Workers {
		shard := strconv.Itoa(i + 1)
		for k, c := range splitCounters {
			ch <- prometheus.MustNewConstMetric(d.counters[k], prometheus.CounterValue, c.get(&s.Workers[i]), model, shard)
		}
	}
	ch <- prometheus.MustNewConstMetric(d.headCompute, prometheus.CounterValue, s.HeadComputeSeconds, model)
}

package prefixindex

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	entries    prometheus.Gauge
	events     prometheus.Counter
	resets     prometheus.Counter
	dropped    prometheus.Counter
	pollErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		entries: prometheus.NewGauge(prometheus.GaugeOpts{Name: "macfleet_gateway_prefix_index_entries",
			Help: "Prefix digests the gateway's prefix index holds, over every backend."}),
		events: prometheus.NewCounter(prometheus.CounterOpts{Name: "macfleet_gateway_prefix_index_events_total",
			Help: "Prefix events (stored, moved between tiers, evicted) applied to the prefix index."}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{Name: "macfleet_gateway_prefix_index_resets_total",
			Help: "Times a backend's set of digests was replaced whole (first poll, new runner epoch, events lost)."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "macfleet_gateway_prefix_index_dropped_total",
			Help: "Stored digests not kept because their backend's set was at the index's cap."}),
		pollErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "macfleet_gateway_prefix_index_poll_errors_total",
			Help: "Failed polls of an agent's prefix events (each backs off before the next)."}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.entries, m.events, m.resets, m.dropped, m.pollErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

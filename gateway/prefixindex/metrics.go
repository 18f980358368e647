package prefixindex

import (
	"errors"
	"fmt"

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
	var err error
	register := func(c prometheus.Metric) prometheus.Metric {
		if err != nil {
			return c
		}
		if e := reg.Register(c.(prometheus.Collector)); e != nil {
			// A gateway restarted in the same process keeps counting in the series of
			// the one before.
			if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](e); ok {
				if same, ok := are.ExistingCollector.(prometheus.Metric); ok {
					return same
				}
			}
			err = fmt.Errorf("registering the prefix index's metrics: %w", e)
		}
		return c
	}
	m.entries = register(m.entries).(prometheus.Gauge)
	m.events = register(m.events).(prometheus.Counter)
	m.resets = register(m.resets).(prometheus.Counter)
	m.dropped = register(m.dropped).(prometheus.Counter)
	m.pollErrors = register(m.pollErrors).(prometheus.Counter)
	return m, err
}

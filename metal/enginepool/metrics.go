package enginepool

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// Metric names of the engine pool, exported by the agent's /metrics.
const (
	MetricMemoryCeiling   = "macfleet_agent_memory_ceiling_bytes"
	MetricMemoryWatermark = "macfleet_agent_memory_watermark_bytes"
	MetricMemoryUsed      = "macfleet_agent_memory_used_bytes"
	MetricMemoryCommitted = "macfleet_agent_memory_committed_bytes"
	MetricMemoryPressure  = "macfleet_agent_pressure_level"
	MetricEvictions       = "macfleet_agent_evictions_total"
	MetricFreedBytesTotal = "macfleet_agent_unload_freed_bytes_total"
	MetricRunnerCrashes   = "macfleet_agent_runner_crashes_total"
	MetricModelState      = "macfleet_agent_model_state"
	MetricModelLeases     = "macfleet_agent_model_leases"
	MetricModelResident   = "macfleet_agent_model_resident_bytes"
	MetricModelReserved   = "macfleet_agent_model_reserved_bytes"
	MetricLoads           = "macfleet_agent_loads_total"
	MetricLoadDuration    = "macfleet_agent_load_duration_seconds"
	MetricUnloads         = "macfleet_agent_unloads_total"
	MetricUnloadFreed     = "macfleet_agent_unload_freed_bytes"
	MetricUnloadDuration  = "macfleet_agent_unload_duration_seconds"
	MetricPressureChanges = "macfleet_agent_memory_pressure_changes_total"

	// Prompt cache, per model: the counters of the SSD tier (ENGINE_POOL.md), of the
	// hot tier and of restores, and the bytes each tier holds.
	MetricPromptCachePrefix = "macfleet_agent_prompt_cache_"
	MetricPromptCacheHot    = "macfleet_agent_prompt_cache_hot_bytes"
	MetricPromptCacheBudget = "macfleet_agent_prompt_cache_hot_budget_bytes"
	MetricPromptCacheSSD    = "macfleet_agent_prompt_cache_ssd_bytes"

	// MetricRunnerSandbox is 1 when runners are confined (metal/runner/sandbox), 0 when the
	// sandbox is off or this machine cannot enforce it; mode "on" with 0 means runners
	// are refused, "allow-unconfined" that they run unconfined by the operator's leave.
	MetricRunnerSandbox = "macfleet_agent_runner_sandboxed"
)

// promptCacheCounters are the per-model prompt cache counters exported as
// macfleet_agent_prompt_cache_<name>_total.
var promptCacheCounters = []struct {
	name, help string
	get        func(*PromptCacheStats) int64
}{
	{"saves", "States handed to the SSD tier (accepted).", func(s *PromptCacheStats) int64 { return s.Saves }},
	{"saves_persisted", "States written to the SSD tier (renamed into place).", func(s *PromptCacheStats) int64 { return s.SavesPersisted }},
	{"errors", "SSD tier writes that failed.", func(s *PromptCacheStats) int64 { return s.Errors }},
	{"hits", "SSD tier lookups that found a state.", func(s *PromptCacheStats) int64 { return s.Hits }},
	{"misses", "SSD tier lookups that found none (a corrupt or truncated file is a miss).", func(s *PromptCacheStats) int64 { return s.Misses }},
	{"evictions", "SSD tier files evicted to stay within the quota.", func(s *PromptCacheStats) int64 { return s.Evictions }},
	{"unlink_failures", "SSD tier files that could not be removed.", func(s *PromptCacheStats) int64 { return s.UnlinkFailures }},
	{"inline_fallbacks", "SSD tier writes done inline because the write queue stayed full for 1s.", func(s *PromptCacheStats) int64 { return s.InlineFallbacks }},
	{"hot_hits", "Hot tier lookups that found a state.", func(s *PromptCacheStats) int64 { return s.HotHits }},
	{"hot_misses", "Hot tier lookups that found none.", func(s *PromptCacheStats) int64 { return s.HotMisses }},
	{"hot_evictions", "Hot tier states evicted to stay within the budget.", func(s *PromptCacheStats) int64 { return s.HotEvictions }},
	{"hot_rejected", "States larger than the runner's whole hot budget, kept by the SSD tier alone (by none without one).", func(s *PromptCacheStats) int64 { return s.HotRejected }},
	{"restores", "Cached states restored into a slot instead of a prefill.", func(s *PromptCacheStats) int64 { return s.Restores }},
	{"restored_tokens", "Prompt tokens a restore spared from prefill.", func(s *PromptCacheStats) int64 { return s.RestoredTokens }},
}

var allStates = []State{StateAbsent, StateLoading, StateReady, StateDraining, StateStopping, StateUnloaded, StateFailed}

// Metrics exports a pool's state (read from Snapshot at scrape time) and its events
// (load and unload histograms, observed as they happen). Create it with NewMetrics
// and register it with a prometheus.Registerer.
type Metrics struct {
	pool *Pool

	loads          *prometheus.CounterVec
	loadDuration   prometheus.Histogram
	unloads        *prometheus.CounterVec
	unloadFreed    prometheus.Histogram
	unloadDuration prometheus.Histogram
	pressure       *prometheus.CounterVec

	ceiling, watermark, used, committed, level, evictions, freed, crashes *prometheus.Desc
	state, leases, resident, reserved                                     *prometheus.Desc
	pcCounters                                                            []*prometheus.Desc
	pcHot, pcBudget, pcSSD                                                *prometheus.Desc
	sandboxed                                                             *prometheus.Desc
	split                                                                 splitDescs
}

// NewMetrics subscribes to p's events and returns its collector.
func NewMetrics(p *Pool) *Metrics {
	m := &Metrics{
		pool: p,
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricLoads,
			Help: "Model load attempts by result (ok, failed, refused: admission said no or the load was canceled)."}, []string{"result"}),
		loadDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricLoadDuration,
			Help: "Time from a load's start (admission included) until the model was Ready, in seconds.",
			// 50ms … ~27min.
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 16)}),
		unloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricUnloads,
			Help: "Engines stopped, by reason and settle outcome."}, []string{"reason", "outcome"}),
		unloadFreed: prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricUnloadFreed,
			Help: "Bytes an unload gave back (settle barrier figure; the runner footprint when indeterminate).",
			// 16 MiB … 256 GiB.
			Buckets: prometheus.ExponentialBuckets(16<<20, 2, 15)}),
		unloadDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricUnloadDuration,
			Help: "Time from the start of an unload's drain to its report, in seconds.",
			// 10ms … ~160s.
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 15)}),
		pressure: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricPressureChanges,
			Help: "Changes of the memory pressure level, by the level entered."}, []string{"level"}),

		ceiling:   prometheus.NewDesc(MetricMemoryCeiling, "The pool's memory ceiling, labelled with the bound that sets it.", []string{"bound"}, nil),
		watermark: prometheus.NewDesc(MetricMemoryWatermark, "The soft and hard memory watermarks.", []string{"watermark"}, nil),
		used:      prometheus.NewDesc(MetricMemoryUsed, "Measured usage at the last enforcer poll: runner footprints plus the agent.", nil, nil),
		committed: prometheus.NewDesc(MetricMemoryCommitted, "Reservations of engines loading or loaded.", nil, nil),
		level:     prometheus.NewDesc(MetricMemoryPressure, "Memory pressure: 0 ok, 1 soft, 2 hard, 3 emergency.", nil, nil),
		evictions: prometheus.NewDesc(MetricEvictions, "Models unloaded to make room or under memory pressure.", nil, nil),
		freed:     prometheus.NewDesc(MetricFreedBytesTotal, "Bytes given back by every unload.", nil, nil),
		crashes:   prometheus.NewDesc(MetricRunnerCrashes, "Runners that exited unexpectedly.", nil, nil),
		state:     prometheus.NewDesc(MetricModelState, "1 for the state each model is in.", []string{"model", "state"}, nil),
		leases:    prometheus.NewDesc(MetricModelLeases, "Leases (active requests) held on each model's engine.", []string{"model"}, nil),
		resident:  prometheus.NewDesc(MetricModelResident, "Each loaded model's runner footprint as measured from outside.", []string{"model"}, nil),
		reserved:  prometheus.NewDesc(MetricModelReserved, "Each loaded model's reservation.", []string{"model"}, nil),
	}
	for _, c := range promptCacheCounters {
		m.pcCounters = append(m.pcCounters, prometheus.NewDesc(MetricPromptCachePrefix+c.name+"_total",
			"Prompt cache: "+c.help+" Counted by the model's current runner.", []string{"model"}, nil))
	}
	m.pcHot = prometheus.NewDesc(MetricPromptCacheHot, "Bytes the prompt cache hot tier of each model's runner holds.", []string{"model"}, nil)
	m.pcBudget = prometheus.NewDesc(MetricPromptCacheBudget, "Each model's share of the agent's prompt cache hot budget, as its runner confirmed it.", []string{"model"}, nil)
	m.pcSSD = prometheus.NewDesc(MetricPromptCacheSSD, "Bytes of each model's prompt cache SSD tier.", []string{"model"}, nil)
	m.sandboxed = prometheus.NewDesc(MetricRunnerSandbox, "1 when runners are confined, 0 when the sandbox is off or unavailable, "+
		"with the mode (on; off; allow-unconfined: unavailable, and runners run unconfined by --allow-unconfined-runners; "+
		"on with 0: unavailable, and runners are refused) and the mechanism (landlock, seatbelt, seccomp, or none).", []string{"mode", "mechanism"}, nil)
	m.split = newSplitDescs()
	p.AddObserver(m)
	return m
}

// LoadFinished implements Observer.
func (m *Metrics) LoadFinished(ev LoadEvent) {
	switch {
	case ev.Err == nil:
		m.loads.WithLabelValues("ok").Inc()
		m.loadDuration.Observe(ev.Duration.Seconds())
	case isLoadFailure(ev.Err):
		m.loads.WithLabelValues("failed").Inc()
	default:
		m.loads.WithLabelValues("refused").Inc()
	}
}

func isLoadFailure(err error) bool {
	var ue *UnavailableError
	return errors.As(err, &ue) && ue.ErrCode == CodeModelLoadFailed
}

// Unloaded implements Observer.
func (m *Metrics) Unloaded(_ string, r UnloadReport) {
	m.unloads.WithLabelValues(string(r.Reason), string(r.Outcome)).Inc()
	m.unloadFreed.Observe(float64(r.FreedBytes))
	m.unloadDuration.Observe(r.Duration.Seconds())
}

// PressureChanged implements Observer.
func (m *Metrics) PressureChanged(_, to PressureLevel) {
	m.pressure.WithLabelValues(string(to)).Inc()
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.loads.Describe(ch)
	m.loadDuration.Describe(ch)
	m.unloads.Describe(ch)
	m.unloadFreed.Describe(ch)
	m.unloadDuration.Describe(ch)
	m.pressure.Describe(ch)
	for _, d := range []*prometheus.Desc{m.ceiling, m.watermark, m.used, m.committed, m.level, m.evictions,
		m.freed, m.crashes, m.state, m.leases, m.resident, m.reserved, m.pcHot, m.pcBudget, m.pcSSD, m.sandboxed} {
		ch <- d
	}
	for _, d := range m.pcCounters {
		ch <- d
	}
	m.split.describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.loads.Collect(ch)
	m.loadDuration.Collect(ch)
	m.unloads.Collect(ch)
	m.unloadFreed.Collect(ch)
	m.unloadDuration.Collect(ch)
	m.pressure.Collect(ch)

	s := m.pool.Snapshot()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(m.ceiling, float64(s.Ceiling.Bytes), string(s.Ceiling.Bound))
	gauge(m.watermark, float64(s.Ceiling.SoftBytes), "soft")
	gauge(m.watermark, float64(s.Ceiling.HardBytes), "hard")
	gauge(m.used, float64(s.UsageBytes))
	gauge(m.committed, float64(s.CommittedBytes))
	gauge(m.level, float64(s.Pressure.Rank()))
	counter(m.evictions, float64(s.Evictions))
	counter(m.freed, float64(s.FreedBytesTotal))
	counter(m.crashes, float64(s.Crashes))
	if f, ok := m.pool.factory.(interface {
		SandboxStatus() (sandbox.Mode, sandbox.Status)
	}); ok {
		mode, st := f.SandboxStatus()
		mechanism, v := st.Mechanism, 0.0
		if mechanism == "" || mode == sandbox.Off {
			mechanism = "none"
		}
		if mode != sandbox.Off && st.Enforced {
			v = 1
		}
		gauge(m.sandboxed, v, string(mode), mechanism)
	}
	for _, ms := range s.Models {
		for _, st := range allStates {
			v := 0.0
			if ms.State == st {
				v = 1
			}
			gauge(m.state, v, ms.Name, string(st))
		}
		gauge(m.leases, float64(ms.Leases), ms.Name)
		gauge(m.resident, float64(ms.ResidentBytes), ms.Name)
		gauge(m.reserved, float64(ms.ReservedBytes), ms.Name)
		if pc := ms.PromptCache; pc != nil {
			for i, c := range promptCacheCounters {
				ch <- prometheus.MustNewConstMetric(m.pcCounters[i], prometheus.CounterValue, float64(c.get(pc)), ms.Name)
			}
			gauge(m.pcHot, float64(pc.HotBytes), ms.Name)
			gauge(m.pcBudget, float64(max(pc.HotBudgetBytes, 0)), ms.Name)
			gauge(m.pcSSD, float64(pc.SSDBytes), ms.Name)
		}
		m.split.collect(ch, ms.Name, ms.Split)
	}
}

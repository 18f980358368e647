// Package janitor keeps a Mac's disk from filling up: every interval it removes the
// model store's files that nothing on the Mac needs (and that no agent sharing the
// store used) and the prompt cache directories of models gone. The cluster agent runs
// it over the store and the prompt cache; `macfleet serve`, whose model files are the
// user's, over the prompt cache only.
package janitor

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// Defaults of Options.
const (
	DefaultInterval   = time.Hour
	DefaultFirstDelay = time.Minute
)

// Metric names of the janitor, exported by the agent's /metrics. kind is what was
// removed: the store's kinds (store.KindBlob, ...) and KindPromptCacheDir.
const (
	MetricGCRemoved = "macfleet_agent_gc_removed_files_total"
	MetricGCFreed   = "macfleet_agent_gc_freed_bytes_total"
	MetricGCErrors  = "macfleet_agent_gc_errors_total"

	KindPromptCacheDir = "prompt_cache_dir"
)

// StorePruner is a Store that can delete what no replica needs (agent/store does).
type StorePruner interface {
	Prune(ctx context.Context, opts store.PruneOptions) (store.PruneReport, error)
}

// Options configure a Janitor.
type Options struct {
	// StoreRetention is how long the store keeps a file nothing uses, or an idle
	// partial download; 0 never prunes the store.
	StoreRetention time.Duration
	// PromptCacheRetention is how long a prompt cache directory no model uses is kept
	// after its last write; 0 never prunes them.
	PromptCacheRetention time.Duration
	// Interval is the time between passes (DefaultInterval when zero); the first
	// pass runs FirstDelay (DefaultFirstDelay when zero) after Run's synced returned.
	Interval, FirstDelay time.Duration
	// Clock times the passes and dates the prompt cache directories; the real clock
	// when nil. The store dates its files with its own clock.
	Clock clock.WithTicker
}

// Janitor runs the passes.
type Janitor struct {
	opts    Options
	store   StorePruner // nil: no store pruning
	factory *runnerproc.ProcessFactory
	// inUse names the models (store sources) and files the Mac needs.
	inUse func() ([]store.Model, []string)
	log   logr.Logger

	removed, freed *prometheus.CounterVec
	errors         prometheus.Counter
}

// New returns a Janitor over st (nil: the store is not pruned) and the prompt cache
// directories of factory, keeping what inUse names; nil when there is nothing to
// prune.
func New(opts Options, st StorePruner, factory *runnerproc.ProcessFactory, inUse func() ([]store.Model, []string), log logr.Logger) *Janitor {
	j := &Janitor{opts: opts, factory: factory, inUse: inUse, log: log}
	if st != nil && opts.StoreRetention > 0 {
		j.store = st
	}
	if opts.PromptCacheRetention <= 0 {
		j.factory = nil
	}
	if j.store == nil && j.factory == nil {
		return nil
	}
	if j.opts.Interval <= 0 {
		j.opts.Interval = DefaultInterval
	}
	if j.opts.FirstDelay <= 0 {
		j.opts.FirstDelay = DefaultFirstDelay
	}
	if j.opts.Clock == nil {
		j.opts.Clock = clock.RealClock{}
	}
	j.removed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricGCRemoved,
		Help: "Files and directories the agent's janitor removed, by kind (blob, partial, ref, local, marker, temp, prompt_cache_dir)."},
		[]string{"kind"})
	j.freed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricGCFreed,
		Help: "Bytes the agent's janitor freed on disk, by kind."}, []string{"kind"})
	j.errors = prometheus.NewCounter(prometheus.CounterOpts{Name: MetricGCErrors,
		Help: "Janitor passes that could not remove something (see the agent's log)."})
	return j
}

// Collectors are the janitor's metrics, for the agent's registry.
func (j *Janitor) Collectors() []prometheus.Collector {
	return []prometheus.Collector{j.removed, j.freed, j.errors}
}

// Run waits for synced (e.g. the replica informer's sync: before it the agent does not
// know which models it needs), then prunes every Interval until ctx ends.
func (j *Janitor) Run(ctx context.Context, synced func(context.Context) bool) error {
	if !synced(ctx) {
		return nil
	}
	j.log.Info("Janitor started", "storeRetention", j.opts.StoreRetention, "promptCacheRetention",
		j.opts.PromptCacheRetention, "interval", j.opts.Interval, "firstIn", j.opts.FirstDelay)
	wait := j.opts.Clock.NewTimer(j.opts.FirstDelay)
	defer wait.Stop()
	select {
	case <-ctx.Done():
		return nil
	case <-wait.C():
	}
	t := j.opts.Clock.NewTicker(j.opts.Interval)
	defer t.Stop()
	for {
		j.pass(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// pass prunes the store and the prompt cache directories once.
func (j *Janitor) pass(ctx context.Context) {
	models, paths := j.inUse()
	if j.store != nil {
		rep, err := j.store.Prune(ctx, store.PruneOptions{Keep: models, KeepPaths: paths, Retention: j.opts.StoreRetention})
		for _, r := range rep.Removed {
			j.removed.WithLabelValues(r.Kind).Inc()
			j.freed.WithLabelValues(r.Kind).Add(float64(r.Bytes))
		}
		if err != nil && ctx.Err() == nil {
			j.errors.Inc()
			j.log.Error(err, "Pruning the model store")
		}
	}
	if j.factory != nil {
		keep := slices.Clone(paths)
		for _, m := range models {
			if h := strings.ToLower(strings.TrimPrefix(m.SHA256, "sha256:")); h != "" {
				// A stored file's directories are named by its digest (after the
				// namespace, runnerproc.PromptCacheDirName): they stay while a replica is
				// bound, even one whose file is not (back) in the store yet.
				keep = append(keep, "sha256-"+h)
			}
		}
		rep, err := j.factory.PrunePromptCacheDirs(ctx, runnerproc.PromptCachePruneOptions{Now: j.opts.Clock.Now(),
			Retention: j.opts.PromptCacheRetention, KeepModels: keep})
		j.removed.WithLabelValues(KindPromptCacheDir).Add(float64(len(rep.Removed)))
		j.freed.WithLabelValues(KindPromptCacheDir).Add(float64(rep.FreedBytes))
		if len(rep.Removed) > 0 {
			j.log.Info("Removed the prompt cache directories of models no longer in use", "dirs", rep.Removed, "freedBytes", rep.FreedBytes,
				"retention", j.opts.PromptCacheRetention)
		}
		if err != nil && ctx.Err() == nil {
			j.errors.Inc()
			j.log.Error(err, "Pruning the prompt cache directories")
		}
	}
}

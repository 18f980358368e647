package cluster

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal"
)

// Defaults of JanitorOptions.
const (
	DefaultGCInterval   = time.Hour
	DefaultGCFirstDelay = time.Minute
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

// JanitorOptions configure the janitor that keeps the disk from filling up: it
// removes the model store's files that no replica bound to this node needs (and that
// no agent sharing the store used) and the prompt cache directories of models gone.
type JanitorOptions struct {
	// StoreRetention is how long the store keeps a file nothing uses, or an idle
	// partial download; 0 never prunes the store.
	StoreRetention time.Duration
	// PromptCacheRetention is how long a prompt cache directory no model uses is kept
	// after its last write; 0 never prunes them.
	PromptCacheRetention time.Duration
	// Interval is the time between passes (DefaultGCInterval when zero); the first
	// pass runs FirstDelay (DefaultGCFirstDelay when zero) after the replica informer
	// synced.
	Interval, FirstDelay time.Duration
	// Clock times the passes and dates the prompt cache directories; the real clock
	// when nil. The store dates its files with its own clock.
	Clock clock.WithTicker
}

// janitor runs the passes.
type janitor struct {
	opts    JanitorOptions
	store   StorePruner // nil: no store pruning
	factory *metal.ProcessFactory
	// inUse names the models this node needs.
	inUse func() ([]store.Model, []string)
	log   logr.Logger

	removed, freed *prometheus.CounterVec
	errors         prometheus.Counter
}

// newJanitor returns nil when there is nothing to prune.
func newJanitor(opts JanitorOptions, st Store, factory *metal.ProcessFactory, inUse func() ([]store.Model, []string), log logr.Logger) *janitor {
	j := &janitor{opts: opts, factory: factory, inUse: inUse, log: log}
	if p, ok := st.(StorePruner); ok && opts.StoreRetention > 0 {
		j.store = p
	}
	if opts.PromptCacheRetention <= 0 {
		j.factory = nil
	}
	if j.store == nil && j.factory == nil {
		return nil
	}
	if j.opts.Interval <= 0 {
		j.opts.Interval = DefaultGCInterval
	}
	if j.opts.FirstDelay <= 0 {
		j.opts.FirstDelay = DefaultGCFirstDelay
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

func (j *janitor) collectors() []prometheus.Collector {
	return []prometheus.Collector{j.removed, j.freed, j.errors}
}

// run waits for synced (the replica informer's sync: before it the agent does not
// know which models it needs), then prunes every Interval until ctx ends.
func (j *janitor) run(ctx context.Context, synced func(context.Context) bool) error {
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
func (j *janitor) pass(ctx context.Context) {
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
				// A stored file's directory is named by its digest alone
				// (metal.PromptCacheModelID): it stays while a replica is bound, even
				// one whose file is not (back) in the store yet.
				keep = append(keep, "sha256-"+h)
			}
		}
		rep, err := j.factory.PrunePromptCacheDirs(ctx, metal.PromptCachePruneOptions{Now: j.opts.Clock.Now(),
			Retention: j.opts.PromptCacheRetention, KeepModels: keep})
		j.removed.WithLabelValues(KindPromptCacheDir).Add(float64(len(rep.Removed)))
		j.freed.WithLabelValues(KindPromptCacheDir).Add(float64(rep.FreedBytes))
		if len(rep.Removed) > 0 {
			j.log.Info("Removed the prompt cache directories of models gone", "dirs", rep.Removed, "freedBytes", rep.FreedBytes,
				"retention", j.opts.PromptCacheRetention)
		}
		if err != nil && ctx.Err() == nil {
			j.errors.Inc()
			j.log.Error(err, "Pruning the prompt cache directories")
		}
	}
}

// inUse names the models this node needs: the source of every replica bound to it
// in the informer's cache, whatever its state, and of every local record (a replica
// being removed), with the files of those records and of every pool entry.
func (s *Syncer) inUse() ([]store.Model, []string) {
	var models []store.Model
	var paths []string
	for _, obj := range s.opts.Informer.GetStore().List() {
		if mr, ok := obj.(*v1alpha1.ModelReplica); ok {
			models = append(models, store.Model{Source: mr.Spec.Template.Model.Source, SHA256: mr.Spec.Template.Model.SHA256})
		}
	}
	s.mu.Lock()
	for _, r := range s.replicas {
		models = append(models, store.Model{Source: r.template.Model.Source, SHA256: r.template.Model.SHA256})
		if r.path != "" {
			paths = append(paths, r.path)
		}
	}
	s.mu.Unlock()
	for _, m := range s.opts.Pool.Snapshot().Models {
		paths = append(paths, m.Spec.Path)
		if m.LoadedSpec != nil {
			paths = append(paths, m.LoadedSpec.Path)
		}
	}
	return models, paths
}

// Package standalone runs one node agent without Kubernetes (`macfleet serve`): the
// engine pool over real runner processes and memory gauges, and the OpenAI + admin
// HTTP API in front of it, configured by agent/config.
package standalone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/devicegauge"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// DefaultShutdownTimeout bounds a graceful shutdown: draining requests, unloading every
// model and settling its memory.
const DefaultShutdownTimeout = 90 * time.Second

// Options are what the command line does not configure.
type Options struct {
	Log logr.Logger
	// InlineImages puts the http(s) images of chat requests inline (server.PolicyImages);
	// nil leaves them to the runner, which refuses them.
	InlineImages server.InlineImagesFunc
	// RunnerOutput, when set, receives every runner's output lines prefixed with the
	// model name.
	RunnerOutput io.Writer
	// Pool tunes the engine pool (timeouts, backoff); the ceiling, reserve and idle
	// timeout come from the configuration.
	Pool enginepool.Config
	// Listener, when set, is served instead of listening on the configured address.
	Listener net.Listener
	// Limits bound the API's connections and requests (httpserver's defaults when
	// zero). There is no write timeout: a stream lasts as long as generation does, and
	// the client's disconnect is what cancels it.
	Limits httpserver.Limits
	// AllowedHosts are names the API answers to besides loopback names, IP addresses
	// and the configured listen host (httpserver.NewHosts; "*": any). Browsers' cross-
	// origin requests are refused whatever the Host.
	AllowedHosts []string
	// Started, when set, is called with the address being served.
	Started func(addr string)
	// TracerProvider traces the OpenAI requests (tracing.New); nil means none.
	TracerProvider trace.TracerProvider
	// SpanRelay exports the runners' spans (runnerproc.ProcessConfig.SpanRelay); nil:
	// runners make none.
	SpanRelay *spanrelay.Forwarder
	// ShutdownTimeout: DefaultShutdownTimeout when zero.
	ShutdownTimeout time.Duration
	// PromptCacheRetention, when positive, removes the prompt cache directories of
	// model files that are no longer configured once nothing in them changed for this
	// long. The model files themselves are the user's and never deleted.
	PromptCacheRetention time.Duration
	// GCInterval is the time between those passes (janitor.DefaultInterval when zero);
	// the first runs GCFirstDelay (janitor.DefaultFirstDelay when zero) after the start.
	GCInterval, GCFirstDelay time.Duration
}

// BuildSpec turns a configured model into the pool's spec: the memory estimate and the
// dimensions the prefill guard needs are read from the GGUF header (internal/estimate)
// unless the configuration gives the memory. A model without a context length gets
// its training context in each slot, as the runner does. ContextLength is per sequence,
// as in a ModelDeployment: the engine holds ContextLength × Parallel tokens.
func BuildSpec(ctx context.Context, m config.Model) (enginepool.ModelSpec, error) {
	e := m.WithDefaults()
	p := estimate.Params{Path: m.Path, ContextLength: int32(e.TotalContext()), Parallel: e.Parallel,
		KVCacheType: estimate.KVCacheType(e.KVCacheType)}
	est, err := estimate.Estimate(ctx, p)
	if err != nil {
		return enginepool.ModelSpec{}, fmt.Errorf("model %q: estimating its memory: %w", m.Name, err)
	}
	if e.ContextLength == 0 && est.Dims.CtxTrain > 0 {
		e.ContextLength = int32(est.Dims.CtxTrain)
		p.ContextLength = int32(e.TotalContext())
		if est, err = estimate.Estimate(ctx, p); err != nil {
			return enginepool.ModelSpec{}, fmt.Errorf("model %q: estimating its memory: %w", m.Name, err)
		}
	}
	if m.Projector != "" {
		pb, err := estimate.Projector(ctx, estimate.Params{Path: m.Projector})
		if err != nil {
			return enginepool.ModelSpec{}, fmt.Errorf("model %q: reading its projector %s: %w", m.Name, m.Projector, err)
		}
		est = est.WithProjector(pb)
	}
	if m.Draft != "" {
		// The draft's context is shaped as the model's: the same context and slots.
		p.Path = m.Draft
		db, err := estimate.Draft(ctx, p)
		if err != nil {
			return enginepool.ModelSpec{}, fmt.Errorf("model %q: estimating its draft model %s: %w", m.Name, m.Draft, err)
		}
		est = est.WithDraft(db)
	}
	// The KV cache type as configured: unset passes no --kv-type (the runner's default).
	e.KVCacheType = m.KVCacheType
	spec := enginepool.ModelSpec{
		Name: m.Name, Aliases: m.Aliases, Path: m.Path, ProjectorPath: m.Projector, DraftPath: m.Draft, Engine: e, Residency: enginepool.Residency(m.Residency),
		IdleTimeout: time.Duration(m.IdleTimeout), EstimatedBytes: est.Total, WeightBytes: est.Weights,
		Dims: enginepool.ModelDims{Layers: int(est.Dims.Layers), Embedding: int(est.Dims.Embd), Heads: int(est.Dims.Heads),
			KVHeads: int(est.Dims.KVHeads), Vocab: int(est.Dims.Vocab), KVTypeSize: kvTypeSize(e.KVCacheType)},
		PromptCache: PromptCacheSpec(m.PromptCache),
	}
	if m.Memory > 0 {
		spec.EstimatedBytes = int64(m.Memory)
	}
	return spec, nil
}

// PromptCacheSpec is the pool's form of a model's prompt cache settings: unset means
// enabled with the agent's settings; a size of 0 turns that tier off.
func PromptCacheSpec(pc *config.PromptCache) enginepool.PromptCacheSpec {
	out := enginepool.PromptCacheSpec{Enabled: pc.IsEnabled()}
	if pc == nil || !out.Enabled {
		return out
	}
	out.HotBytes, out.SSDBytes = sizeOrOff(pc.HotBytes), sizeOrOff(pc.SSDBytes)
	return out
}

// PromptCacheHotBytes is the pool's form (enginepool.Config.PromptCacheHotBytes) of the
// agent's hot budget: unset is the default fraction of the ceiling, 0 none.
func PromptCacheHotBytes(s *config.Size) int64 { return sizeOrOff(s) }

// sizeOrOff is the pool's form of a configured size where unset means the default
// (0) and an explicit 0 turns the thing off (-1).
func sizeOrOff(s *config.Size) int64 {
	switch {
	case s == nil:
		return 0
	case *s == 0:
		return -1
	}
	return int64(*s)
}

// PromptCacheSSDBytes is the factory's form (runnerproc.ProcessConfig.PromptCacheSSDBytes)
// of the agent's per-model SSD quota: unset is config.DefaultPromptCacheSSDBytes.
func PromptCacheSSDBytes(s *config.Size) int64 {
	if s == nil {
		return config.DefaultPromptCacheSSDBytes
	}
	return int64(*s)
}

// kvTypeSize is the bytes per KV element of a cache type (block sizes for quantized ones).
func kvTypeSize(t engine.KVCacheType) float64 {
	switch t {
	case "q8_0":
		return 34.0 / 32
	case "q4_0":
		return 18.0 / 32
	}
	return 2
}

// Run serves cfg (already completed by config.Complete) until ctx ends, then shuts
// down gracefully: it stops accepting connections, lets requests drain, and unloads
// every model, logging each unload's report.
func Run(ctx context.Context, cfg config.Config, opts Options) error {
	log := opts.Log
	pcfg := opts.Pool
	pcfg.PromptCacheHotBytes = PromptCacheHotBytes(cfg.PromptCacheHotBytes)
	pcfg.CeilingBytes = int64(cfg.MemoryCeiling)
	pcfg.ReserveBytes = int64(cfg.MemoryReserve)
	if cfg.IdleTimeout != 0 {
		pcfg.IdleTimeout = time.Duration(cfg.IdleTimeout)
	}
	eng, err := NewEngine(runnerproc.ProcessConfig{RunnerPath: cfg.Runner, Threads: cfg.RunnerThreads,
		Sandbox: sandbox.Mode(cfg.RunnerSandbox), AllowUnconfined: cfg.AllowUnconfinedRunners, Log: log.WithName("runner"), Output: opts.RunnerOutput,
		PromptCacheDir: cfg.PromptCacheDir, PromptCacheSSDBytes: PromptCacheSSDBytes(cfg.PromptCacheSSDBytes),
		SpanRelay: opts.SpanRelay}, pcfg, nil, log)
	if err != nil {
		return err
	}
	pool := eng.Pool
	specs := make([]enginepool.ModelSpec, 0, len(cfg.Models))
	for _, m := range cfg.Models {
		spec, err := BuildSpec(ctx, m)
		if err != nil {
			return err
		}
		specs = append(specs, spec)
	}
	obs := &logObserver{log: log, pool: pool}
	pool.AddObserver(obs)
	if err := register(eng, specs, cfg, log); err != nil {
		return err
	}
	// The janitor starts once the models are registered: a pass before that sees an
	// empty pool and would remove the configured models' prompt cache directories.
	if opts.PromptCacheRetention > 0 && cfg.PromptCacheDir != "" {
		defer startJanitor(ctx, opts, eng, log)()
	}

	srv, err := server.New(pool, server.Options{Accelerators: devicegauge.Cached(devicegauge.Detect(), 10*time.Second), APIKey: cfg.APIKey, MaxBodyBytes: int64(cfg.MaxBodyBytes),
		InlineImages: opts.InlineImages, Log: log.WithName("http"), TracerProvider: opts.TracerProvider})
	if err != nil {
		return err
	}
	hosts, err := httpserver.NewHosts(cfg.Listen, opts.AllowedHosts)
	if err != nil {
		return err
	}
	var ln net.Listener
	if opts.Listener != nil {
		ln = httpserver.Listener(opts.Listener, opts.Limits)
	} else if ln, err = httpserver.Listen(cfg.Listen, opts.Limits); err != nil {
		return err
	}
	// A web page in the user's browser must neither call the API (a cross-origin POST
	// to unload or to spend the models) nor read it (DNS rebinding).
	httpSrv := httpserver.New(httpserver.Guard(srv.Handler(), hosts), opts.Limits)

	poolCtx, stopPool := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPool()
	poolDone := make(chan error, 1)
	go func() { poolDone <- pool.Run(poolCtx) }()
	serveDone := make(chan error, 1)
	go func() { serveDone <- httpSrv.Serve(ln) }()
	addr := ln.Addr().String()
	log.Info("Serving the OpenAI and admin API", "addr", addr, "apiKey", cfg.APIKey != "", "runner", eng.RunnerPath)
	if opts.Started != nil {
		opts.Started(addr)
	}
	go loadEager(ctx, pool, specs, srv, log)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-serveDone:
		log.Error(serveErr, "The HTTP server stopped")
	}
	err = shutdown(log, srv, httpSrv, stopPool, poolDone, serveErr, opts.ShutdownTimeout)
	obs.flush()
	if err == nil {
		log.Info("Stopped")
	}
	return err
}

// startJanitor prunes the prompt cache directories of model files no longer served
// until the returned function stops it. The model files are the user's: only prompt
// cache directories are pruned.
func startJanitor(ctx context.Context, opts Options, eng *Engine, log logr.Logger) (stop func()) {
	gcCtx, stopGC := context.WithCancel(ctx)
	gcDone := make(chan struct{})
	jan := janitor.New(janitor.Options{PromptCacheRetention: opts.PromptCacheRetention, Interval: opts.GCInterval,
		FirstDelay: opts.GCFirstDelay}, nil, eng.Factory, func() ([]store.Model, []string) {
		var keep []string
		for _, m := range eng.Pool.Snapshot().Models {
			keep = append(keep, m.Spec.Path)
			if m.LoadedSpec != nil {
				keep = append(keep, m.LoadedSpec.Path)
			}
		}
		return nil, keep
	}, log.WithName("janitor"))
	go func() {
		defer close(gcDone)
		_ = jan.Run(gcCtx, func(context.Context) bool { return true })
	}()
	return func() {
		stopGC()
		<-gcDone
	}
}

// register registers the models with the pool, logging each with the threads its
// runner gets, then the ceiling and the prompt cache's budgets.
func register(eng *Engine, specs []enginepool.ModelSpec, cfg config.Config, log logr.Logger) error {
	pool := eng.Pool
	for _, spec := range specs {
		if err := pool.Register(spec); err != nil {
			return err
		}
		log.Info("Model registered", "model", spec.Name, "path", spec.Path, "residency", spec.Residency,
			"contextLength", spec.Engine.TotalContext(), "parallel", spec.Engine.Parallel,
			"threads", spec.Engine.WithRunnerThreads(cfg.RunnerThreads, eng.PerformanceCores, spec.WeightBytes).Threads,
			"estimatedBytes", spec.EstimatedBytes, "promptCache", spec.PromptCache.Enabled)
	}
	c := pool.Ceiling()
	log.Info("Memory ceiling", "bytes", c.Bytes, "bound", c.Bound, "softBytes", c.SoftBytes, "hardBytes", c.HardBytes,
		"detail", c.Describe())
	log.Info("Prompt cache", "ssdDir", cfg.PromptCacheDir, "ssdBytesPerModel", PromptCacheSSDBytes(cfg.PromptCacheSSDBytes),
		"hotBytes", pool.PromptCacheHotBudget())
	return nil
}

// loadEager loads the Resident and Pinned models now; the agent is ready once each
// has loaded or failed (a failure is logged and retried by the next request).
func loadEager(ctx context.Context, pool *enginepool.Pool, specs []enginepool.ModelSpec, srv *server.Server, log logr.Logger) {
	var eager sync.WaitGroup
	for _, spec := range specs {
		if spec.Residency == enginepool.OnDemand {
			continue
		}
		eager.Go(func() {
			if err := pool.Load(ctx, spec.Name); err != nil && ctx.Err() == nil {
				log.Error(err, "Loading a resident model failed", "model", spec.Name)
			}
		})
	}
	eager.Wait()
	if ctx.Err() == nil {
		srv.SetReady(true)
		log.Info("Ready")
	}
}

// shutdown stops accepting connections and drains the requests in flight while the
// pool unloads every model (its drain lets leases finish, then aborts what remains).
func shutdown(log logr.Logger, srv *server.Server, httpSrv *http.Server, stopPool context.CancelFunc,
	poolDone <-chan error, serveErr error, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	log.Info("Shutting down: draining requests and unloading models", "timeout", timeout)
	var errs []error
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		errs = append(errs, serveErr)
	}
	return errors.Join(append(errs, srv.Shutdown(httpSrv, stopPool, poolDone, timeout))...)
}

// logObserver logs one line per load and unload with the bytes measured.
type logObserver struct {
	log  logr.Logger
	pool *enginepool.Pool

	mu sync.Mutex
	// logged is the time of the last unload report logged per model.
	logged map[string]time.Time
}

func (o *logObserver) LoadFinished(ev enginepool.LoadEvent) {
	if ev.Err != nil {
		o.log.Error(ev.Err, "Model load failed", "model", ev.Model, "duration", ev.Duration.Round(time.Millisecond))
		return
	}
	var resident, reserved int64
	var pid int
	for _, m := range o.pool.Snapshot().Models {
		if m.Name == ev.Model {
			resident, reserved, pid = m.ResidentBytes, m.ReservedBytes, m.PID
		}
	}
	o.log.Info("Model loaded", "model", ev.Model, "duration", ev.Duration.Round(time.Millisecond),
		"residentBytes", resident, "reservedBytes", reserved, "pid", pid)
}

func (o *logObserver) Unloaded(model string, r enginepool.UnloadReport) {
	// Logged under the lock, so flush cannot skip a report whose line is not out yet.
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.logged == nil {
		o.logged = map[string]time.Time{}
	}
	if o.logged[model].Equal(r.Time) {
		return
	}
	o.logged[model] = r.Time
	o.log.Info("Model unloaded", "model", model, "reason", r.Reason, "outcome", r.Outcome,
		"freedBytes", r.FreedBytes, "residentBytes", r.ResidentBytes, "aborted", r.Aborted,
		"duration", r.Duration.Round(time.Millisecond))
}

// flush logs the unload reports the pool made that no callback has logged yet: the
// pool notifies observers after an unload's waiters are released, so the reports of
// the final shutdown can still be on their way when the pool has closed.
func (o *logObserver) flush() {
	for _, m := range o.pool.Snapshot().Models {
		if m.LastUnload != nil {
			o.Unloaded(m.Name, *m.LastUnload)
		}
	}
}

func (o *logObserver) PressureChanged(from, to enginepool.PressureLevel) {
	o.log.Info("Memory pressure changed", "from", from, "to", to)
}

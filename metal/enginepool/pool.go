package enginepool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/macfleet/macfleet/internal/devicegauge"
)

// Config tunes the pool. Zero values take the documented defaults.
type Config struct {
	// CeilingBytes is a configured ceiling; the pool ceiling is
	// min(static, Metal cap, configured). Zero means none.
	CeilingBytes int64
	// ReserveBytes is what the static ceiling leaves to the OS; zero means
	// DefaultReserve (4 GiB below 24 GiB of memory, else 6 GiB).
	ReserveBytes int64
	// SoftFraction and HardFraction of the ceiling: 0.90 and 0.95.
	SoftFraction float64
	HardFraction float64
	// EmergencyMarginBytes over the ceiling is an emergency at once: 2 GiB.
	EmergencyMarginBytes int64

	// IdleTimeout is the default idle timeout of OnDemand models: 5m. Negative
	// disables the default (models without their own timeout never expire).
	IdleTimeout time.Duration
	// LoadTimeout bounds Loading (admission, start, WaitReady): 10m.
	LoadTimeout time.Duration
	// DrainTimeout bounds the wait for leases on graceful unloads (admin, idle,
	// removal, shutdown, eviction): 30s.
	DrainTimeout time.Duration
	// PressureDrainTimeout bounds it on pressure unloads: 2s.
	PressureDrainTimeout time.Duration
	// AbortWaitTimeout bounds the wait for request goroutines after runner.Abort: 5s.
	AbortWaitTimeout time.Duration
	// StopGrace is passed to Runner.Stop (graceful → SIGTERM → SIGKILL): 5s.
	StopGrace time.Duration
	// StopTimeout bounds Runner.Stop altogether: StopGrace + 10s.
	StopTimeout time.Duration
	// SettleInterval and SettleTimeout drive the settle barrier: 250ms and 5s.
	SettleInterval time.Duration
	SettleTimeout  time.Duration
	// DeviceGauge reads the accelerators that have memory of their own (a discrete
	// card), for the freed device memory of each unload; nil on a Mac, whose GPU
	// shares the memory the host gauge measures.
	DeviceGauge devicegauge.Gauge
	// SettleToleranceBytes is the minimum tolerance: 256 MiB (or 5% of resident).
	SettleToleranceBytes int64
	// BackoffInitial doubles per consecutive failure up to BackoffMax: 1s, 5m.
	BackoffInitial time.Duration
	BackoffMax     time.Duration
	// Poll intervals of the enforcer: 1s active, 10s loaded but idle, 30s empty.
	PollActive time.Duration
	PollIdle   time.Duration
	PollEmpty  time.Duration
	// RunnerCallTimeout bounds SetLimits, Abort, Status and ClearCache calls: 2s.
	RunnerCallTimeout time.Duration
	// RetryAfter is the hint given with 503s whose end is not known: 1s.
	RetryAfter time.Duration
	// AgentPID is the process whose footprint counts as the agent's own:
	// os.Getpid() by default, negative to leave it out.
	AgentPID int
	// KeepRunnersOnExit makes Run, when its context ends, Detach instead of Close:
	// the runners of Ready models are left running for the next agent to adopt
	// (runnerproc.ProcessConfig.StateDir). For an agent that restarts; `macfleet serve` unloads.
	KeepRunnersOnExit bool
	// PromptCacheHotBytes is the agent's prompt cache hot budget, shared among the
	// runners whose model enables the cache (see hotcache.go): 0 means
	// DefaultPromptCacheHotFraction of the ceiling, negative no hot tier.
	PromptCacheHotBytes int64
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.IdleTimeout, 5*time.Minute)
	def(&c.LoadTimeout, 10*time.Minute)
	def(&c.DrainTimeout, 30*time.Second)
	def(&c.PressureDrainTimeout, 2*time.Second)
	def(&c.AbortWaitTimeout, 5*time.Second)
	def(&c.StopGrace, 5*time.Second)
	def(&c.StopTimeout, c.StopGrace+10*time.Second)
	def(&c.SettleInterval, 250*time.Millisecond)
	def(&c.SettleTimeout, 5*time.Second)
	def(&c.BackoffInitial, time.Second)
	def(&c.BackoffMax, 5*time.Minute)
	def(&c.PollActive, time.Second)
	def(&c.PollIdle, 10*time.Second)
	def(&c.PollEmpty, 30*time.Second)
	def(&c.RunnerCallTimeout, 2*time.Second)
	def(&c.RetryAfter, time.Second)
	if c.IdleTimeout < 0 {
		c.IdleTimeout = 0
	}
	if c.SettleToleranceBytes == 0 {
		c.SettleToleranceBytes = 256 * mib
	}
	if c.EmergencyMarginBytes == 0 {
		c.EmergencyMarginBytes = 2 * gib
	}
	if c.AgentPID == 0 {
		c.AgentPID = os.Getpid()
	}
	return c
}

// Pool is the engine pool of one node. Create it with New, drive its memory enforcer
// with Run, and take a Lease per request with Acquire:
//
//	p, _ := enginepool.New(cfg, runnerproc.NewProcessFactory(pcfg), gauge, clock.RealClock{}, log)
//	go p.Run(ctx)                       // enforcer; unloads everything when ctx ends
//	_ = p.Register(spec)                // from flags/config; Update on reload
//	_ = p.Load(ctx, "qwen")             // eager load (Resident, Pinned, admin)
//	l, err := p.Acquire(ctx, "qwen")    // per request, at routing; err is a StatusError
//	defer l.Release()                   // after the last byte (stream goroutine returned)
//	r, err := l.Runner()                // r.Client(), r.BaseURL() to proxy to
//	err = p.CheckPrefill("qwen", n)     // before the first response byte
//
// Loads, unloads and settles run in owner goroutines; the pool mutex only guards
// state transitions, so nothing that serves ever waits behind them.
//
// The shared state — the tables, the reservations, the enforcer's level, the
// counters and the mutex that guards them — is one type, state (state.go), whose
// few methods each lock once to read a snapshot or apply a plan. Each effect holds
// its own dependencies and a pointer to that state: loader (load.go: the owner
// goroutine of Loading — admission, start, Ready), unloader (unload.go: the owner of
// Draining and Stopping — drain, stop, settle, release, report), meter (measure.go: footprints
// and the runners' own reports), hotBudget (hotcache.go: the prompt cache hot
// shares) and enforcer (enforcer.go: the memory enforcer's poll).
// Pool wires them and is the API.
type Pool struct {
	cfg        Config
	hw         Hardware
	factory    RunnerFactory
	log        logr.Logger
	st         *state
	wake       wakes
	baseCancel context.CancelFunc

	meter    meter
	hot      hotBudget
	loader   loader
	unloader unloader
	enforcer enforcer
}

// New builds a pool. It reads the hardware once to compute the ceiling; it starts no
// goroutine until a model loads or Run is called.
func New(cfg Config, factory RunnerFactory, gauge Gauge, clk clock.WithTicker, log logr.Logger) (*Pool, error) {
	if factory == nil || gauge == nil {
		return nil, errors.New("enginepool: a RunnerFactory and a Gauge are required")
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	cfg = cfg.withDefaults()
	hw, err := gauge.Hardware()
	if err != nil {
		return nil, fmt.Errorf("reading the hardware: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := deps{cfg: cfg, clock: ownerClock{clk}, log: log, gauge: gauge,
		wake: wakes{now: make(chan struct{}, 1), active: make(chan struct{}, 1)}}
	st := newState(d, hw, ctx)
	m := meter{d, st}
	u := unloader{d, st}
	l := loader{deps: d, st: st, factory: factory, admitting: make(chan struct{}, 1), meter: m, unloader: u}
	p := &Pool{cfg: cfg, hw: hw, factory: factory, log: log, st: st, wake: d.wake, baseCancel: cancel,
		meter: m, hot: hotBudget{d, st}, loader: l, unloader: u}
	p.enforcer = enforcer{deps: d, st: st, meter: m, hot: p.hot, unloader: u}
	return p, nil
}

// Hardware is what New read from the gauge.
func (p *Pool) Hardware() Hardware { return p.hw }

// Ceiling is the current pool ceiling.
func (p *Pool) Ceiling() Ceiling { return p.st.view(query{}).ceiling }

// SetConfiguredCeiling changes the configured ceiling (0 removes it), for example
// from the MacNode spec. It takes effect for the next admission and poll.
func (p *Pool) SetConfiguredCeiling(bytes int64) Ceiling {
	c := p.st.change(change{kind: changeCeiling, ceiling: bytes}).ceiling
	signal(p.wake.now)
	return c
}

// Register adds a model. It does not load it: Acquire or Load does.
func (p *Pool) Register(spec ModelSpec) error {
	spec, err := normalizeSpec(spec)
	if err != nil {
		return err
	}
	return p.st.change(change{kind: changeRegister, spec: spec}).err
}

// Update changes a registered model's spec. Fields that do not touch the engine
// (residency, idle timeout, aliases) apply at once; the rest apply at the next load.
// A Loading or Ready entry is never replaced, so no engine is ever orphaned outside
// the pool's accounting by a config reload.
func (p *Pool) Update(spec ModelSpec) error {
	spec, err := normalizeSpec(spec)
	if err != nil {
		return err
	}
	return p.st.change(change{kind: changeUpdate, spec: spec}).err
}

// Remove unregisters a model. A loaded model is unloaded first (reason removed) and
// deleted once its engine has stopped; the returned channel is closed then.
func (p *Pool) Remove(name string) (<-chan struct{}, error) {
	return p.unregister(change{kind: changeRemove, model: name})
}

// unregister applies a Remove, Retire or admin unload and starts the unload it began.
func (p *Pool) unregister(c change) (<-chan struct{}, error) {
	out := p.st.change(c)
	if out.err != nil {
		return nil, out.err
	}
	p.unloader.start(out.jobs)
	return out.done, nil
}

func normalizeSpec(spec ModelSpec) (ModelSpec, error) {
	if spec.Name == "" {
		return spec, errors.New("enginepool: a model needs a name")
	}
	if spec.EstimatedBytes < 0 {
		return spec, fmt.Errorf("model %q: negative memory estimate", spec.Name)
	}
	switch spec.Residency {
	case "":
		spec.Residency = OnDemand
	case OnDemand, Resident, Pinned:
	default:
		return spec, fmt.Errorf("model %q: unknown residency %q (Resident, Pinned or OnDemand)", spec.Name, spec.Residency)
	}
	spec.Aliases = slices.Clone(spec.Aliases)
	return spec, nil
}

// Detach stops the pool while leaving the runners of Ready models running: it refuses
// new leases, lets go of every runner that can outlive the pool (a Detacher whose
// Detach succeeds, e.g. a process started with runnerproc.ProcessConfig.StateDir) without
// stopping it, and unloads the rest like Close (loads in progress are canceled). Leases
// already taken keep working until the agent exits. It returns how many runners
// were left running.
func (p *Pool) Detach(ctx context.Context) (int, error) {
	out := p.st.change(change{kind: changeDetach})
	for _, g := range out.detached {
		p.log.V(2).Info("Runner left running for the next agent", "model", g.name, "pid", g.pid)
	}
	if err := p.end(ctx, out); err != nil {
		return len(out.detached), fmt.Errorf("detaching the engine pool: %w", err)
	}
	return len(out.detached), nil
}

// Close refuses new leases, unloads every model (reason shutdown) and waits for them
// up to ctx. It is called by Run when its context ends; calling it twice is harmless.
func (p *Pool) Close(ctx context.Context) error {
	if err := p.end(ctx, p.st.change(change{kind: changeClose})); err != nil {
		return fmt.Errorf("closing the engine pool: %w", err)
	}
	return nil
}

// end starts the unloads of Close or Detach, waits for them up to ctx, and cancels
// the loads' base context.
func (p *Pool) end(ctx context.Context, out changed) error {
	defer p.baseCancel()
	p.unloader.start(out.jobs)
	for _, w := range out.waits {
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func newState(d deps, hw Hardware, base context.Context) *state {
	return &state{
		cfg: d.cfg, hw: hw, clock: d.clock, wake: d.wake, base: base,
		ceiling: ComputeCeiling(hw, d.cfg.CeilingBytes, d.cfg.ReserveBytes, d.cfg.SoftFraction, d.cfg.HardFraction),
		entries: map[string]*entry{},
		aliases: map[string]string{},
		engines: map[*engine]struct{}{},
		level:   PressureOK,
	}
}

// StartUnload begins unloading model (admin) and returns a channel closed once it is
// unloaded. Unloading a model that is not loaded returns a closed channel; unloading
// one that is loading cancels the load.
func (p *Pool) StartUnload(model string) (<-chan struct{}, error) {
	return p.unregister(change{kind: changeUnload, model: model})
}

// Unload unloads model and waits for it, bounded by ctx. It returns the report of the
// engine it stopped, or nil when the model was not loaded.
func (p *Pool) Unload(ctx context.Context, model string) (*UnloadReport, error) {
	out := p.st.change(change{kind: changeUnload, model: model})
	if out.err != nil {
		return nil, out.err
	}
	p.unloader.start(out.jobs)
	select {
	case <-out.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("unloading %s: %w", model, context.Cause(ctx))
	}
	last := p.st.view(query{entry: out.entry}).lastUnload
	if last == nil || last == out.lastUnload {
		return nil, nil // nothing was running (or a load was canceled before its runner started)
	}
	r := *last
	return &r, nil
}

// Retire takes model out of service for good while keeping it registered: from now
// on every Acquire and Load gets the 503 of a draining model (CodeModelDraining, so
// that a gateway retries elsewhere), a load in progress is canceled, and a loaded
// engine is drained — its leases are waited for as for an admin unload — stopped and
// measured (reason ReasonRetired), its report kept in the entry's snapshot. The
// returned channel is closed once the model is unloaded. Retire is idempotent; only
// Remove ends a retired entry.
func (p *Pool) Retire(model string) (<-chan struct{}, error) {
	return p.unregister(change{kind: changeRetire, model: model})
}

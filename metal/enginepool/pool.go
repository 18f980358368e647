package enginepool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
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
// Pool itself holds the mutex, the state it guards and the application of what the
// decisions of package decide say; each effect is a small type beside it, with a
// pointer back to it: loader (acquire.go: admission, start, Ready), unloader
// (unload.go: drain, stop, release, report), settler (settle.go: the settle
// barrier), meter (measure.go: footprints and the runners' own reports), hotBudget
// (hotcache.go: the prompt cache hot shares) and enforcer (enforcer.go: the memory
// enforcer's poll). None of them holds state of its own.
type Pool struct {
	cfg     Config
	factory RunnerFactory
	gauge   Gauge
	clock   ownerClock
	log     logr.Logger
	hw      Hardware

	baseCtx    context.Context
	baseCancel context.CancelFunc

	// admitting serializes admissions (not serving): a one-slot semaphore.
	admitting chan struct{}
	// wakeNow asks for an enforcer poll at once; wakeActive asks for one within
	// PollActive (a request started).
	wakeNow    chan struct{}
	wakeActive chan struct{}

	mu        sync.Mutex
	ceiling   Ceiling
	entries   map[string]*entry
	aliases   map[string]string
	engines   map[*engine]struct{} // every engine with a runner not yet reaped
	observers []Observer
	closed    bool
	gen       uint64
	committed int64
	// activity counts load starts, loads finished and leases taken; the settle
	// barrier compares it to see whether anything else ran since its pre sample.
	activity uint64
	// Enforcer state.
	usage          int64
	agentBytes     int64
	level          PressureLevel
	overCeilingRun int
	lastPoll       time.Time
	// hotShrunk: hard pressure took every hot tier to zero; they stay there until
	// pressure is ok again.
	hotShrunk bool
	// Counters.
	loads, loadFailures, crashes, unloads, evictions int64
	freedTotal                                       int64

	// The effects (see above), each a pointer back to the pool.
	meter    meter
	settler  settler
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
	p := &Pool{
		cfg:        cfg,
		factory:    factory,
		gauge:      gauge,
		clock:      ownerClock{clk},
		log:        log,
		hw:         hw,
		baseCtx:    ctx,
		baseCancel: cancel,
		admitting:  make(chan struct{}, 1),
		wakeNow:    make(chan struct{}, 1),
		wakeActive: make(chan struct{}, 1),
		ceiling:    ComputeCeiling(hw, cfg.CeilingBytes, cfg.ReserveBytes, cfg.SoftFraction, cfg.HardFraction),
		entries:    map[string]*entry{},
		aliases:    map[string]string{},
		engines:    map[*engine]struct{}{},
		level:      PressureOK,
	}
	p.meter, p.settler, p.hot = meter{p}, settler{p}, hotBudget{p}
	p.loader, p.unloader, p.enforcer = loader{p}, unloader{p}, enforcer{p}
	return p, nil
}

// Hardware is what New read from the gauge.
func (p *Pool) Hardware() Hardware { return p.hw }

// Ceiling is the current pool ceiling.
func (p *Pool) Ceiling() Ceiling {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ceiling
}

// SetConfiguredCeiling changes the configured ceiling (0 removes it), for example
// from the MacNode spec. It takes effect for the next admission and poll.
func (p *Pool) SetConfiguredCeiling(bytes int64) Ceiling {
	p.mu.Lock()
	p.cfg.CeilingBytes = bytes
	p.ceiling = ComputeCeiling(p.hw, bytes, p.cfg.ReserveBytes, p.cfg.SoftFraction, p.cfg.HardFraction)
	c := p.ceiling
	p.mu.Unlock()
	signal(p.wakeNow)
	return c
}

// Register adds a model. It does not load it: Acquire or Load does.
func (p *Pool) Register(spec ModelSpec) error {
	spec, err := normalizeSpec(spec)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("enginepool: pool is closed")
	}
	e := p.entries[spec.Name]
	if e != nil && !e.removed {
		return fmt.Errorf("model %q is already registered", spec.Name)
	}
	if err := p.setSpecLocked(e, spec); err != nil {
		return err
	}
	if e != nil {
		// Re-registered while its engine was still stopping: the entry (and the engine
		// it owns) is kept, the removal canceled, and the spec applies at the next load.
		e.removed, e.retired = false, false
	}
	return nil
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
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.entries[spec.Name]
	if !ok || e.removed {
		return &UnknownModelError{Model: spec.Name}
	}
	return p.setSpecLocked(e, spec)
}

// Remove unregisters a model. A loaded model is unloaded first (reason removed) and
// deleted once its engine has stopped; the returned channel is closed then.
func (p *Pool) Remove(name string) (<-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.lookupLocked(name)
	if e == nil || e.removed {
		return nil, &UnknownModelError{Model: name}
	}
	e.removed = true
	if !e.state.Transient() && e.state != StateReady {
		p.deleteEntryLocked(e)
		return closedChan(), nil
	}
	return p.unloader.startLocked(e, ReasonRemoved), nil
}

// setSpecLocked is what Register and Update share: it makes spec the desired spec
// of e (a new entry when e is nil) and moves the alias table from e's old aliases to
// spec's, refusing — before it changes anything — an alias that is another model's
// name or alias, or a name that is another model's alias. The engine e owns keeps
// the spec it was started with (engine.spec).
func (p *Pool) setSpecLocked(e *entry, spec ModelSpec) error {
	for _, a := range spec.Aliases {
		if a == spec.Name {
			continue
		}
		if _, ok := p.entries[a]; ok {
			return fmt.Errorf("alias %q of model %q is the name of another model", a, spec.Name)
		}
		if owner, ok := p.aliases[a]; ok && owner != spec.Name {
			return fmt.Errorf("alias %q of model %q is already an alias of %q", a, spec.Name, owner)
		}
	}
	if owner, ok := p.aliases[spec.Name]; ok && owner != spec.Name {
		return fmt.Errorf("model name %q is already an alias of %q", spec.Name, owner)
	}
	if e == nil {
		e = &entry{state: StateAbsent}
		p.entries[spec.Name] = e
	}
	for _, a := range e.spec.Aliases {
		if p.aliases[a] == spec.Name {
			delete(p.aliases, a)
		}
	}
	e.spec = spec
	for _, a := range spec.Aliases {
		if a != spec.Name {
			p.aliases[a] = spec.Name
		}
	}
	return nil
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
	p.mu.Lock()
	p.closed = true
	kept := 0
	var waits []<-chan struct{}
	for _, e := range p.entries {
		g := e.eng
		if e.state == StateReady && g != nil && !g.tearingDown {
			// Detach only closes idle connections and ends watchers: no I/O to wait on.
			if d, ok := g.runner.(Detacher); ok && d.Detach() {
				g.tearingDown = true // the crash watcher must not report it
				g.invalidateLocked(&UnavailableError{Model: g.name, State: StateStopping, ErrCode: CodePoolClosed,
					Reason: "the node agent is shutting down", Retry: p.cfg.RetryAfter})
				p.committed -= g.reservation
				delete(p.engines, g)
				e.eng = nil
				e.setStableLocked(StateUnloaded)
				kept++
				p.log.V(2).Info("Runner left running for the next agent", "model", g.name, "pid", g.pid)
				continue
			}
		}
		if e.state == StateReady || e.state.Transient() {
			waits = append(waits, p.unloader.startLocked(e, ReasonShutdown))
		}
	}
	p.mu.Unlock()
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			p.baseCancel()
			return kept, fmt.Errorf("detaching the engine pool: %w", ctx.Err())
		}
	}
	p.baseCancel()
	return kept, nil
}

// Close refuses new leases, unloads every model (reason shutdown) and waits for them
// up to ctx. It is called by Run when its context ends; calling it twice is harmless.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	var waits []<-chan struct{}
	for _, e := range p.entries {
		if e.state == StateReady || e.state.Transient() {
			waits = append(waits, p.unloader.startLocked(e, ReasonShutdown))
		}
	}
	p.mu.Unlock()
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			p.baseCancel()
			return fmt.Errorf("closing the engine pool: %w", ctx.Err())
		}
	}
	p.baseCancel()
	return nil
}

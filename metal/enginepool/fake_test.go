package enginepool

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// This file holds the fakes the pool's timing tests use: a Gauge whose host figure is
// the sum of live fake runners (with a configurable lag after a runner exits), a
// Runner whose readiness, crashes and stops are driven by the test, and a factory
// that records what it started. Real-runner variants of these tests live with the
// HTTP layer.

const fakeAgentPID = 1

// fakeGauge: host used = base + live process footprints + residues of exited ones.
type fakeGauge struct {
	mu    sync.Mutex
	hw    Hardware
	base  int64
	procs map[int]int64
	// lag is how many Host samples a stopped runner's memory stays visible; -1
	// keeps it forever (a leak the settle barrier must time out on).
	lag      int
	residues []*residue
	// extra is memory used by something outside the pool (another app, or another
	// model growing while one unloads).
	extra     int64
	hostCalls int
	onHost    func(g *fakeGauge) // called under g.mu on every Host sample
}

type residue struct {
	bytes int64
	left  int
}

func newFakeGauge(total int64) *fakeGauge {
	return &fakeGauge{hw: Hardware{TotalBytes: total, Chip: "fake"}, procs: map[int]int64{fakeAgentPID: 0}}
}

func (g *fakeGauge) Hardware() (Hardware, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.hw, nil
}

func (g *fakeGauge) Host() (HostMemory, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.hostCalls++
	if g.onHost != nil {
		g.onHost(g)
	}
	used := g.base + g.extra
	for _, b := range g.procs {
		used += b
	}
	kept := g.residues[:0]
	for _, r := range g.residues {
		if r.left == 0 {
			continue
		}
		used += r.bytes
		if r.left > 0 {
			r.left--
		}
		kept = append(kept, r)
	}
	g.residues = kept
	return HostMemory{TotalBytes: g.hw.TotalBytes, UsedBytes: used, AvailableBytes: g.hw.TotalBytes - used}, nil
}

func (g *fakeGauge) Process(pid int) (int64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.procs[pid]
	if !ok {
		return 0, fmt.Errorf("process %d: no such process", pid)
	}
	return b, nil
}

func (g *fakeGauge) setProc(pid int, b int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.procs[pid] = b
}

func (g *fakeGauge) addProc(pid int, delta int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.procs[pid]; ok {
		g.procs[pid] += delta
	}
}

func (g *fakeGauge) exit(pid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.procs[pid]
	if !ok {
		return
	}
	delete(g.procs, pid)
	if g.lag != 0 {
		g.residues = append(g.residues, &residue{bytes: b, left: g.lag})
	}
}

func (g *fakeGauge) setLag(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lag = n
}

// fakeFactory starts fakeRunners.
type fakeFactory struct {
	g *fakeGauge

	mu      sync.Mutex
	nextPID int
	runners []*fakeRunner
	events  []string
	// manualReady makes runners wait for MarkReady / FailLoad.
	manualReady bool
	// lagOnLoad keeps a loading runner invisible to the gauge until it is ready.
	lagOnLoad bool
	// footprint overrides the measured footprint (default: the estimate).
	footprint func(ModelSpec) int64
	// off, when set, is what each runner reports it serves its model without.
	off func(ModelSpec) []runnerapi.PathOff
	// deviceSeparate: every runner reports its model on a card with memory of its
	// own (runnerapi.Status.DeviceMemorySeparate).
	deviceSeparate bool
	// startGate, when set, blocks Start until it is closed.
	startGate chan struct{}
	startErr  error
	started   chan *fakeRunner
}

func newFakeFactory(g *fakeGauge) *fakeFactory {
	return &fakeFactory{g: g, nextPID: 100, started: make(chan *fakeRunner, 64)}
}

func (f *fakeFactory) event(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, s)
}

func (f *fakeFactory) Events() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.events...)
}

func (f *fakeFactory) Start(ctx context.Context, spec ModelSpec, ceiling int64) (Runner, error) {
	f.mu.Lock()
	gate, startErr := f.startGate, f.startErr
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	if startErr != nil {
		return nil, startErr
	}
	f.mu.Lock()
	f.nextPID++
	r := &fakeRunner{
		f: f, spec: spec, ceiling: ceiling, pid: f.nextPID, hotBudget: 0,
		ready: make(chan struct{}), exited: make(chan struct{}), abortCh: make(chan struct{}),
	}
	fp := spec.EstimatedBytes
	if f.footprint != nil {
		fp = f.footprint(spec)
	}
	r.fp = fp
	if f.off != nil {
		r.off = f.off(spec)
	}
	f.runners = append(f.runners, r)
	f.events = append(f.events, "start:"+spec.Name)
	manual, lag := f.manualReady, f.lagOnLoad
	f.mu.Unlock()
	if lag {
		f.g.setProc(r.pid, 0)
	} else {
		f.g.setProc(r.pid, fp)
	}
	if !manual {
		r.MarkReady()
	}
	f.started <- r
	return r, nil
}

// Runners returns the runners started for model, oldest first.
func (f *fakeFactory) Runners(model string) []*fakeRunner {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*fakeRunner
	for _, r := range f.runners {
		if r.spec.Name == model {
			out = append(out, r)
		}
	}
	return out
}

// waitRunner waits for the n-th runner of model and returns it.
func (f *fakeFactory) waitRunner(t *testing.T, model string, n int) *fakeRunner {
	eventually(t, fmt.Sprintf("runner #%d of %s", n, model), func() bool { return len(f.Runners(model)) >= n })
	return f.Runners(model)[n-1]
}

func (f *fakeFactory) last(t *testing.T, model string) *fakeRunner {
	t.Helper()
	rs := f.Runners(model)
	if len(rs) == 0 {
		t.Fatalf("no runner was started for %s", model)
	}
	return rs[len(rs)-1]
}

// fakeRunner is one fake engine process.
type fakeRunner struct {
	f       *fakeFactory
	spec    ModelSpec
	ceiling int64
	pid     int
	fp      int64

	ready     chan struct{}
	readyOnce sync.Once
	exited    chan struct{}
	exitOnce  sync.Once

	mu       sync.Mutex
	loadErr  error
	exitErr  error
	limits   []Limits
	aborts   int
	abortCh  chan struct{}
	stops    int
	stopGate chan struct{}
	clears   int
	cache    int64
	// Prompt cache hot tier: budget (-1 before the pool set one), bytes held, and
	// every budget the pool pushed.
	hotBudget int64
	hotBytes  int64
	// hotRejected counts states the hot tier refused (rejectHot).
	hotRejected int64
	budgets     []int64
	budgetErr   error
	// ssd is what Status reports as the SSD tier (nil: none).
	ssd *runnerapi.PromptCacheSSD
	// split and splitHead are what Status reports as a split head's links.
	split     []runnerapi.SplitWorkerStatus
	splitHead float64
	// off is what Status reports the runner serves its model without; with the
	// prompt cache off it reports no cache and refuses every budget, like the runner.
	off []runnerapi.PathOff
}

// cacheOff says whether the runner serves its model without the prompt cache.
func (r *fakeRunner) cacheOff() bool {
	return slices.ContainsFunc(r.off, func(o runnerapi.PathOff) bool { return o.Path == runnerapi.PathPromptCache })
}

var _ Runner = (*fakeRunner)(nil)

func (r *fakeRunner) MarkReady() {
	r.readyOnce.Do(func() {
		r.f.g.setProc(r.pid, r.fp)
		close(r.ready)
	})
}

// FailLoad makes the runner exit during its load.
func (r *fakeRunner) FailLoad(err error) {
	r.mu.Lock()
	r.loadErr = err
	r.mu.Unlock()
	r.terminate(err)
}

// Crash makes the runner exit unexpectedly (SIGKILL, a Metal abort).
func (r *fakeRunner) Crash(err error) { r.terminate(err) }

func (r *fakeRunner) terminate(err error) {
	r.exitOnce.Do(func() {
		r.mu.Lock()
		r.exitErr = err
		r.mu.Unlock()
		r.f.g.exit(r.pid)
		r.f.event("exit:" + r.spec.Name)
		close(r.exited)
	})
}

func (r *fakeRunner) WaitReady(ctx context.Context) error {
	select {
	case <-r.ready:
		return nil
	case <-r.exited:
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.loadErr != nil {
			return fmt.Errorf("runner exited while loading: %w", r.loadErr)
		}
		return errors.New("runner exited while loading")
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (r *fakeRunner) Client() *http.Client { return http.DefaultClient }
func (r *fakeRunner) BaseURL() string      { return "http://fake-" + r.spec.Name }
func (r *fakeRunner) PID() int             { return r.pid }
func (r *fakeRunner) Exited() <-chan struct{} {
	return r.exited
}
func (r *fakeRunner) ExitErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exitErr
}

func (r *fakeRunner) Status(ctx context.Context) (RunnerStatus, error) {
	fp, _ := r.f.g.Process(r.pid)
	r.mu.Lock()
	defer r.mu.Unlock()
	pc := &runnerapi.PromptCacheStatus{Hot: runnerapi.PromptCacheHot{Bytes: r.hotBytes, BudgetBytes: r.hotBudget, Rejected: r.hotRejected}, SSD: r.ssd}
	if r.cacheOff() {
		pc = nil
	}
	r.f.mu.Lock()
	separate := r.f.deviceSeparate
	r.f.mu.Unlock()
	return RunnerStatus{State: "ready", PID: r.pid, FootprintBytes: fp, PromptCache: pc, Off: slices.Clone(r.off),
		Split: slices.Clone(r.split), SplitHeadComputeSeconds: r.splitHead, DeviceMemorySeparate: separate}, nil
}

// SetCacheBudget records the budget and frees the hot bytes over it, like the runner.
func (r *fakeRunner) SetCacheBudget(ctx context.Context, b runnerapi.CacheBudget) (runnerapi.CacheBudgetResult, error) {
	r.mu.Lock()
	if r.cacheOff() {
		defer r.mu.Unlock()
		if b.HotBytes != nil {
			r.budgets = append(r.budgets, *b.HotBytes)
		}
		return runnerapi.CacheBudgetResult{}, errors.New("409 Conflict: " + r.off[0].Reason)
	}
	if r.budgetErr != nil {
		defer r.mu.Unlock()
		return runnerapi.CacheBudgetResult{}, r.budgetErr
	}
	var res runnerapi.CacheBudgetResult
	if b.HotBytes != nil {
		r.hotBudget = *b.HotBytes
		r.budgets = append(r.budgets, r.hotBudget)
		r.f.event(fmt.Sprintf("budget:%s=%d", r.spec.Name, r.hotBudget))
		if over := r.hotBytes - r.hotBudget; over > 0 {
			r.hotBytes -= over
			res.EvictedBytes, res.EvictedEntries = over, 1
			r.mu.Unlock()
			r.f.g.addProc(r.pid, -over)
			r.mu.Lock()
		}
	}
	res.HotBytes = r.hotBudget
	r.mu.Unlock()
	return res, nil
}

// fillHot simulates states saved in the hot tier: up to the budget.
func (r *fakeRunner) fillHot(b int64) int64 {
	r.mu.Lock()
	add := min(b, max(r.hotBudget-r.hotBytes, 0))
	r.hotBytes += add
	r.mu.Unlock()
	r.f.g.addProc(r.pid, add)
	return add
}

// rejectHot simulates a state larger than the whole hot budget: refused, counted.
func (r *fakeRunner) rejectHot() {
	r.mu.Lock()
	r.hotRejected++
	r.mu.Unlock()
}

func (r *fakeRunner) Budgets() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.budgets...)
}

func (r *fakeRunner) HotBudget() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hotBudget
}

func (r *fakeRunner) HotBytes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hotBytes
}

func (r *fakeRunner) SetLimits(ctx context.Context, l Limits) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limits = append(r.limits, l)
	return nil
}

func (r *fakeRunner) Limits() []Limits {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Limits(nil), r.limits...)
}

// Abort ends every fake request on this runner (see startRequest).
func (r *fakeRunner) Abort(ctx context.Context) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.aborts++
	r.f.event("abort:" + r.spec.Name)
	close(r.abortCh)
	r.abortCh = make(chan struct{})
	return 1, nil
}

func (r *fakeRunner) Aborts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.aborts
}

func (r *fakeRunner) abortSignal() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.abortCh
}

func (r *fakeRunner) ClearCache(ctx context.Context) (CacheClearResult, error) {
	r.mu.Lock()
	r.clears++
	freed := r.cache + r.hotBytes
	r.cache, r.hotBytes = 0, 0
	r.mu.Unlock()
	r.f.g.addProc(r.pid, -freed)
	return CacheClearResult{BytesReclaimed: freed, EntriesCleared: 1}, nil
}

func (r *fakeRunner) Clears() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.clears
}

// growCache simulates prompt-cache state held in the runner.
func (r *fakeRunner) growCache(b int64) {
	r.mu.Lock()
	r.cache += b
	r.mu.Unlock()
	r.f.g.addProc(r.pid, b)
}

func (r *fakeRunner) Stop(ctx context.Context, grace time.Duration) error {
	r.mu.Lock()
	r.stops++
	gate := r.stopGate
	r.mu.Unlock()
	r.f.event("stop:" + r.spec.Name)
	var err error
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			err = context.Cause(ctx) // escalated to SIGKILL: the process is gone anyway
		}
	}
	r.terminate(nil)
	return err
}

// gateStop makes Stop block until the returned channel is closed (or its deadline).
func (r *fakeRunner) gateStop() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopGate = make(chan struct{})
	return r.stopGate
}

func (r *fakeRunner) Stops() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stops
}

// recorder is an Observer.
type recorder struct {
	mu       sync.Mutex
	loads    []LoadEvent
	unloads  map[string][]UnloadReport
	pressure []PressureLevel
}

func (o *recorder) LoadFinished(ev LoadEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.loads = append(o.loads, ev)
}

func (o *recorder) Unloaded(model string, r UnloadReport) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.unloads == nil {
		o.unloads = map[string][]UnloadReport{}
	}
	o.unloads[model] = append(o.unloads[model], r)
}

func (o *recorder) PressureChanged(from, to PressureLevel) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pressure = append(o.pressure, to)
}

func (o *recorder) Unloads(model string) []UnloadReport {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]UnloadReport(nil), o.unloads[model]...)
}

// harness wires a pool to the fakes and a fake clock.
type harness struct {
	t   *testing.T
	p   *Pool
	clk *testingclock.FakeClock
	g   *fakeGauge
	f   *fakeFactory
	obs *recorder
}

var epoch = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// newHarness builds a pool on a fake 64 GiB host with a configured 10 GiB ceiling
// (soft 9 GiB, hard 9.5 GiB) unless cfg says otherwise.
func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	return newHarnessHW(t, cfg, Hardware{TotalBytes: 64 * gib, Chip: "fake"})
}

// newHarnessHW is newHarness on given hardware; a negative CeilingBytes means no
// configured ceiling.
func newHarnessHW(t *testing.T, cfg Config, hw Hardware) *harness {
	t.Helper()
	g := newFakeGauge(hw.TotalBytes)
	g.hw = hw
	switch {
	case cfg.CeilingBytes == 0:
		cfg.CeilingBytes = 10 * gib
	case cfg.CeilingBytes < 0:
		cfg.CeilingBytes = 0
	}
	cfg.AgentPID = fakeAgentPID
	h := &harness{t: t, clk: testingclock.NewFakeClock(epoch), g: g, f: newFakeFactory(g), obs: &recorder{}}
	// Goroutines may log after the test ended; t.Log would panic then.
	var logMu sync.Mutex
	ended := false
	t.Cleanup(func() { logMu.Lock(); ended = true; logMu.Unlock() })
	log := funcr.New(func(prefix, args string) {
		logMu.Lock()
		defer logMu.Unlock()
		if !ended {
			t.Log(prefix, args)
		}
	}, funcr.Options{Verbosity: 2})
	p, err := New(cfg, h.f, g, h.clk, log)
	if err != nil {
		t.Fatal(err)
	}
	p.AddObserver(h.obs)
	h.p = p
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Release every runner a test left gated so teardowns can finish.
		h.f.mu.Lock()
		if h.f.startGate != nil && !isClosed(h.f.startGate) {
			close(h.f.startGate)
		}
		runners := append([]*fakeRunner(nil), h.f.runners...)
		h.f.mu.Unlock()
		for _, r := range runners {
			r.mu.Lock()
			if r.stopGate != nil && !isClosed(r.stopGate) {
				close(r.stopGate)
			}
			r.mu.Unlock()
			r.MarkReady()
		}
		done := make(chan error, 1)
		go func() { done <- p.Close(ctx) }()
		for {
			select {
			case <-done:
				return
			default:
				h.clk.Step(time.Second) // drive any deadline a test left pending
				time.Sleep(time.Millisecond)
			}
		}
	})
	return h
}

func (h *harness) register(name string, estGiB float64, res Residency) ModelSpec {
	h.t.Helper()
	spec := ModelSpec{Name: name, Path: "/models/" + name + ".gguf", EstimatedBytes: int64(estGiB * float64(gib)), Residency: res,
		Dims: ModelDims{Layers: 8, Embedding: 1024, Heads: 16, KVHeads: 4, Vocab: 32000, KVTypeSize: 2}}
	if err := h.p.Register(spec); err != nil {
		h.t.Fatal(err)
	}
	return spec
}

// ctx bounds a call of a test in real time, so a regression fails instead of hanging.
func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	h.t.Cleanup(cancel)
	return ctx
}

func (h *harness) acquire(name string) *Lease {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := h.p.Acquire(ctx, name)
	if err != nil {
		h.t.Fatalf("Acquire(%s): %v", name, err)
	}
	return l
}

// load acquires and releases, leaving the model Ready and idle; it then moves the
// clock on so load order is also LRU order.
func (h *harness) load(name string) {
	h.t.Helper()
	h.acquire(name).Release()
	h.clk.Step(time.Second)
}

func (h *harness) model(name string) ModelSnapshot {
	h.t.Helper()
	for _, m := range h.p.Snapshot().Models {
		if m.Name == name {
			return m
		}
	}
	return ModelSnapshot{Name: name, State: "<not registered>"}
}

func (h *harness) state(name string) State { return h.model(name).State }

// eventually polls cond (real time, bounded) — no fixed sleeps.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (h *harness) waitState(name string, s State) {
	h.t.Helper()
	eventually(h.t, fmt.Sprintf("%s to be %s (is %s)", name, s, h.state(name)), func() bool { return h.state(name) == s })
}

// stepUntil moves the fake clock forward in steps until cond holds.
func (h *harness) stepUntil(what string, step time.Duration, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out (clock at +%s) waiting for %s", h.clk.Now().Sub(epoch), what)
		}
		h.clk.Step(step)
		time.Sleep(time.Millisecond)
	}
}

// request is a fake in-flight request: it holds its lease until it is finished, its
// runner aborts it, or its engine stops — like the HTTP proxy goroutine.
type request struct {
	lease  *Lease
	finish chan struct{}
	done   chan struct{}
	// ignoreAbort models a goroutine stuck outside the runner (a slow client).
	ignoreAbort bool
}

func (h *harness) startRequest(name string, ignoreAbort bool) *request {
	h.t.Helper()
	l := h.acquire(name)
	rn, err := l.Runner()
	if err != nil {
		h.t.Fatal(err)
	}
	fr := rn.(*fakeRunner)
	abort := fr.abortSignal()
	if ignoreAbort {
		abort = nil
	}
	rq := &request{lease: l, finish: make(chan struct{}), done: make(chan struct{}), ignoreAbort: ignoreAbort}
	go func() {
		defer close(rq.done)
		defer func() {
			h.f.event("release:" + name)
			l.Release()
		}()
		if ignoreAbort {
			<-rq.finish
			return
		}
		select {
		case <-rq.finish:
		case <-abort:
		case <-l.Done():
		}
	}()
	return rq
}

func (rq *request) end() {
	if !isClosed(rq.finish) {
		close(rq.finish)
	}
	<-rq.done
}

func (rq *request) returned() bool { return isClosed(rq.done) }

func statusOf(t *testing.T, err error) (int, string) {
	t.Helper()
	se, ok := AsStatusError(err)
	if !ok {
		t.Fatalf("error %v (%T) is not a StatusError", err, err)
	}
	return se.HTTPStatus(), se.Code()
}

func contains(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

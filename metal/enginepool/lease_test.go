package enginepool

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"
)

func TestAcquireLoadsOnDemandAndReleaseIsIdempotent(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 2, OnDemand)
	if got := h.state("a"); got != StateAbsent {
		t.Fatalf("state before first request = %s, want Absent", got)
	}

	l := h.acquire("a")
	m := h.model("a")
	if m.State != StateReady || m.Leases != 1 || m.ReservedBytes != 2*gib || m.PID == 0 {
		t.Fatalf("after Acquire: %+v", m)
	}
	if got := h.p.Snapshot().CommittedBytes; got != 2*gib {
		t.Fatalf("committed = %d, want 2 GiB", got)
	}
	r, err := l.Runner()
	if err != nil || r.BaseURL() != "http://fake-a" {
		t.Fatalf("Runner() = %v, %v", r, err)
	}
	if !l.ColdStart() {
		t.Error("the lease that loaded the model does not say it was a cold start")
	}

	l.Release()
	l.Release()
	if got := h.model("a").Leases; got != 0 {
		t.Fatalf("leases after double release = %d, want 0", got)
	}
	l2 := h.acquire("a")
	if l2.ColdStart() {
		t.Error("a lease of a loaded model says it was a cold start")
	}
	l.Release() // a stale handle must not release someone else's lease
	if got := h.model("a").Leases; got != 1 {
		t.Fatalf("leases = %d after a stale Release, want 1", got)
	}
	if _, err := l.Runner(); err == nil {
		t.Fatal("Runner() on a released lease succeeded")
	}
	l2.Release()
	if n := len(h.f.Runners("a")); n != 1 {
		t.Fatalf("%d runners started, want 1", n)
	}
}

func TestAcquireResolvesAliasesAndRejectsUnknownModels(t *testing.T) {
	h := newHarness(t, Config{})
	if err := h.p.Register(ModelSpec{Name: "qwen", Aliases: []string{"qwen-latest"}, EstimatedBytes: gib}); err != nil {
		t.Fatal(err)
	}
	h.acquire("qwen-latest").Release()
	if got := h.state("qwen"); got != StateReady {
		t.Fatalf("state = %s, want Ready", got)
	}
	_, err := h.p.Acquire(h.ctx(), "nope")
	if status, code := statusOf(t, err); status != http.StatusNotFound || code != CodeModelNotFound {
		t.Fatalf("unknown model: %d %s", status, code)
	}
	if err := h.p.Register(ModelSpec{Name: "other", Aliases: []string{"qwen-latest"}}); err == nil {
		t.Fatal("an alias taken by another model was accepted")
	}
}

func TestConcurrentAcquiresShareOneLoad(t *testing.T) {
	h := newHarness(t, Config{})
	h.f.manualReady = true
	h.register("a", 2, OnDemand)

	var wg sync.WaitGroup
	leases := make(chan *Lease, 5)
	for range 5 {
		wg.Go(func() {
			l, err := h.p.Acquire(h.ctx(), "a")
			if err != nil {
				t.Error(err)
				return
			}
			leases <- l
		})
	}
	r := <-h.f.started
	h.waitState("a", StateLoading)
	r.MarkReady()
	wg.Wait()
	close(leases)
	for l := range leases {
		l.Release()
	}
	if n := len(h.f.Runners("a")); n != 1 {
		t.Fatalf("%d runners started for 5 concurrent requests, want 1", n)
	}
	if m := h.model("a"); m.Requests != 5 || m.Leases != 0 {
		t.Fatalf("requests %d leases %d, want 5 and 0", m.Requests, m.Leases)
	}
}

// A request holds its lease from routing to its last byte: an engine with a lease
// that has not yet been "used" is never evicted, expired or pressure-unloaded.
func TestLeaseHeldFromRoutingPreventsEviction(t *testing.T) {
	h := newHarness(t, Config{IdleTimeout: time.Minute})
	h.register("a", 6, OnDemand)
	h.register("b", 6, OnDemand)
	h.load("a")

	l := h.acquire("a") // routed, not yet proxied
	_, err := h.p.Acquire(h.ctx(), "b")
	if status, code := statusOf(t, err); status != http.StatusInsufficientStorage || code != CodeInsufficientMemory {
		t.Fatalf("admitting b next to a leased a: %d %s (%v)", status, code, err)
	}
	if !contains(err.Error(), "a (busy)") {
		t.Fatalf("error does not name the busy model: %v", err)
	}

	h.clk.Step(10 * time.Minute) // far past a's idle timeout
	h.p.enforcer.poll()
	if got, stops := h.state("a"), h.f.last(t, "a").Stops(); got != StateReady || stops != 0 {
		t.Fatalf("leased a after idle timeout: state %s, stops %d", got, stops)
	}

	l.Release()
	h.acquire("b").Release()
	if got := h.state("a"); got != StateUnloaded {
		t.Fatalf("a = %s after its lease ended and b needed room, want Unloaded", got)
	}
}

// When an engine stops, its request counters go with it: a request stuck past the
// drain and abort deadlines cannot leave a phantom busy count that blocks eviction.
func TestCountersResetOnStop(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 6, OnDemand)
	h.register("b", 6, OnDemand)
	h.load("a")
	stuck := h.startRequest("a", true) // ignores the abort

	if _, err := h.p.StartUnload("a"); err != nil {
		t.Fatal(err)
	}
	h.stepUntil("a to unload past a stuck request", time.Second, func() bool { return h.state("a") == StateUnloaded })
	if m := h.model("a"); m.Leases != 0 {
		t.Fatalf("leases after stop = %d, want 0", m.Leases)
	}
	if h.f.last(t, "a").Aborts() == 0 {
		t.Fatal("the drain deadline passed without an abort")
	}

	h.load("a") // a fresh engine, while the old request is still stuck
	if m := h.model("a"); m.Leases != 0 {
		t.Fatalf("new engine's leases = %d, want 0 (a phantom count survived the stop)", m.Leases)
	}
	h.acquire("b").Release()
	if got := h.state("a"); got != StateUnloaded {
		t.Fatalf("a = %s, want it evicted for b (no phantom busy count)", got)
	}
	stuck.end() // the old request finally returns and releases its stale lease
	h.load("a")
	if m := h.model("a"); m.Leases != 0 || m.State != StateReady {
		t.Fatalf("after a stale release: %+v", m)
	}
}

// Stop waits for every request goroutine that touched the engine (up to the drain
// deadline, then aborts and waits again), and process exit returns every byte.
func TestStopWaitsForRequestGoroutines(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 6, OnDemand)
	h.register("b", 8, OnDemand)
	h.load("a")
	rq := h.startRequest("a", false) // ends when the runner aborts it

	done, err := h.p.StartUnload("a")
	if err != nil {
		t.Fatal(err)
	}
	for range 29 { // inside the 30s drain deadline nothing may stop the engine
		h.clk.Step(time.Second)
		if h.f.last(t, "a").Stops() != 0 || rq.returned() {
			t.Fatalf("engine stopped or request ended inside the drain deadline (stops %d)", h.f.last(t, "a").Stops())
		}
	}
	if got := h.state("a"); got != StateDraining {
		t.Fatalf("state = %s, want Draining", got)
	}
	h.stepUntil("the drain deadline", time.Second, func() bool { return isClosed(done) })
	if !rq.returned() {
		t.Fatal("unload finished while a request goroutine was still running")
	}
	ev := h.f.Events()
	if i, j, k := indexOf(ev, "abort:a"), indexOf(ev, "release:a"), indexOf(ev, "stop:a"); !(i >= 0 && i < j && j < k) {
		t.Fatalf("events %v: want abort, then the request's release, then stop", ev)
	}
	h.acquire("b").Release() // 8 GiB fits again: nothing of a is left
	if s := h.p.Snapshot(); s.CommittedBytes != 8*gib || s.Runners != 1 {
		t.Fatalf("committed %d runners %d, want only b", s.CommittedBytes, s.Runners)
	}
}

// Draining refuses leases (503 + Retry-After, no reload outside accounting), and a
// handle to a stopped engine reports an error instead of handing out a dead engine.
func TestDrainingRefusesLeasesAndHandlesInvalidated(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 3, OnDemand)
	h.load("a")
	rq := h.startRequest("a", true)

	if _, err := h.p.StartUnload("a"); err != nil {
		t.Fatal(err)
	}
	_, err := h.p.Acquire(h.ctx(), "a")
	status, code := statusOf(t, err)
	se, _ := AsStatusError(err)
	if status != http.StatusServiceUnavailable || code != CodeModelDraining || se.RetryAfter() < time.Second {
		t.Fatalf("Acquire while draining: %d %s retry %s", status, code, se.RetryAfter())
	}
	if n, c := len(h.f.Runners("a")), h.p.Snapshot().CommittedBytes; n != 1 || c != 3*gib {
		t.Fatalf("while draining: %d runners, committed %d; want 1 and 3 GiB", n, c)
	}

	h.stepUntil("a to unload", time.Second, func() bool { return h.state("a") == StateUnloaded })
	if _, err := rq.lease.Runner(); !IsEngineStopped(err) {
		t.Fatalf("late Runner() = %v, want an engine_stopped error", err)
	}
	if !isClosed(rq.lease.Done()) || !IsEngineStopped(rq.lease.Err()) {
		t.Fatal("lease.Done not closed after the engine stopped")
	}
	rq.end()

	h.load("a")
	if n, c := len(h.f.Runners("a")), h.p.Snapshot().CommittedBytes; n != 2 || c != 3*gib {
		t.Fatalf("after reload: %d runners, committed %d; want 2 and one 3 GiB reservation", n, c)
	}
}

// Every transient state has one owner and a deadline: a request that never ends
// and a runner that ignores its stop cannot latch the entry; nor can a load that
// never finishes.
func TestTransientStatesHaveOwnerAndDeadline(t *testing.T) {
	t.Run("unload", func(t *testing.T) {
		h := newHarness(t, Config{})
		h.register("a", 3, OnDemand)
		h.load("a")
		stuck := h.startRequest("a", true)
		h.f.last(t, "a").gateStop() // never opened: Stop must be escalated by its deadline

		if _, err := h.p.StartUnload("a"); err != nil {
			t.Fatal(err)
		}
		h.stepUntil("a to leave Draining/Stopping", time.Second, func() bool { return h.state("a") == StateUnloaded })
		h.acquire("a").Release()
		if got := h.state("a"); got != StateReady {
			t.Fatalf("state = %s, want Ready after a reload", got)
		}
		stuck.end()
	})
	t.Run("load", func(t *testing.T) {
		h := newHarness(t, Config{LoadTimeout: time.Minute})
		h.f.manualReady = true
		h.register("a", 3, OnDemand)
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-h.f.started; cancel() }()
		_, err := h.p.Acquire(ctx, "a")
		if status, code := statusOf(t, err); status != http.StatusServiceUnavailable || code != CodeModelLoading {
			t.Fatalf("caller giving up on a load: %d %s", status, code)
		}
		h.stepUntil("the load deadline", 10*time.Second, func() bool { return h.state("a") == StateFailed })
		m := h.model("a")
		if !contains(m.FailureReason, "deadline") || m.ReservedBytes != 0 || h.p.Snapshot().CommittedBytes != 0 {
			t.Fatalf("after load timeout: %+v", m)
		}
		h.f.mu.Lock()
		h.f.manualReady = false
		h.f.mu.Unlock()
		h.clk.Step(m.RetryAt.Sub(h.clk.Now()))
		h.acquire("a").Release()
	})
}

// The pool mutex is never held across a load, a stop or a settle: serving loaded
// models, status and config changes go on while another engine starts or stops.
func TestLockNeverHeldAcrossIO(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 2, OnDemand)
	h.register("b", 2, OnDemand)
	h.register("c", 2, OnDemand)
	h.load("a")
	h.load("c")

	gate := make(chan struct{})
	h.f.mu.Lock()
	h.f.startGate = gate
	h.f.mu.Unlock()
	loaded := make(chan error, 1)
	go func() {
		l, err := h.p.Acquire(h.ctx(), "b")
		if err == nil {
			l.Release()
		}
		loaded <- err
	}()
	h.waitState("b", StateLoading)
	stopGate := h.f.last(t, "c").gateStop()
	if _, err := h.p.StartUnload("c"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c's runner to be asked to stop", func() bool { return h.f.last(t, "c").Stops() == 1 })

	mustReturn(t, "serving a while b loads and c stops", func() {
		l := h.acquire("a")
		if _, err := l.Runner(); err != nil {
			t.Error(err)
		}
		l.Release()
		_ = h.p.Snapshot()
		if err := h.p.Update(ModelSpec{Name: "a", EstimatedBytes: 2 * gib, IdleTimeout: time.Hour}); err != nil {
			t.Error(err)
		}
		if err := h.p.CheckPrefill("a", 100); err != nil {
			t.Error(err)
		}
		h.p.enforcer.poll()
	})
	close(gate)
	close(stopGate)
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	h.waitState("c", StateUnloaded)
}

// A config reload (Register/Update) never replaces a Loading or Ready entry: the
// running engine keeps its spec and its reservation; the new spec applies at the
// next load; Remove unloads through the normal path.
func TestConfigReloadNeverReplacesLoadedEntries(t *testing.T) {
	h := newHarness(t, Config{})
	h.f.manualReady = true
	old := h.register("a", 3, OnDemand)

	got := make(chan *Lease, 1)
	go func() {
		l, err := h.p.Acquire(h.ctx(), "a")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	r := <-h.f.started
	if err := h.p.Register(old); err == nil {
		t.Fatal("registering a loading model again succeeded")
	}
	next := old
	next.Path, next.EstimatedBytes = "/models/a-v2.gguf", 4*gib
	if err := h.p.Update(next); err != nil {
		t.Fatal(err)
	}
	if st := h.state("a"); st != StateLoading {
		t.Fatalf("Update replaced a loading entry: state %s", st)
	}
	r.MarkReady()
	l := <-got
	if l == nil {
		t.FailNow()
	}
	if err := h.p.Update(next); err != nil { // again while Ready
		t.Fatal(err)
	}
	m, s := h.model("a"), h.p.Snapshot()
	if m.State != StateReady || m.LoadedSpec.Path != old.Path || m.Spec.Path != next.Path || !m.PendingRestart ||
		s.CommittedBytes != 3*gib || s.Runners != 1 || l.Spec().Path != old.Path {
		t.Fatalf("after a reload during load: %+v, committed %d, runners %d", m, s.CommittedBytes, s.Runners)
	}
	l.Release()

	if _, err := h.p.Unload(h.ctx(), "a"); err != nil {
		t.Fatal(err)
	}
	h.f.mu.Lock()
	h.f.manualReady = false
	h.f.mu.Unlock()
	h.load("a")
	if r := h.f.last(t, "a"); r.spec.Path != next.Path || h.p.Snapshot().CommittedBytes != 4*gib {
		t.Fatalf("reload used %s, committed %d", r.spec.Path, h.p.Snapshot().CommittedBytes)
	}

	rq := h.startRequest("a", true)
	done, err := h.p.Remove("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.p.Acquire(h.ctx(), "a"); err == nil {
		t.Fatal("a removed model was still leased")
	}
	if s := h.p.Snapshot(); s.Runners != 1 || s.CommittedBytes != 4*gib {
		t.Fatalf("removed but draining: runners %d committed %d (the engine left the accounting early)", s.Runners, s.CommittedBytes)
	}
	rq.end()
	eventually(t, "the removal", func() bool { return isClosed(done) })
	if s := h.p.Snapshot(); s.Runners != 0 || s.CommittedBytes != 0 || len(s.Models) != 0 {
		t.Fatalf("after removal: %+v", s)
	}
}

// A runner that dies (SIGKILL, Metal abort) fails the requests in flight, leaves the
// entry Failed with a reason and backoff, keeps the agent up, and the next Acquire
// after the backoff loads it again.
func TestRunnerCrashFailsLeasesAndReloadsAfterBackoff(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 3, OnDemand)
	h.register("b", 1, OnDemand)
	h.load("b")
	h.load("a")
	rq := h.startRequest("a", false)

	h.f.last(t, "a").Crash(errors.New("signal: killed"))
	eventually(t, "the request to fail", rq.returned)
	if err := rq.lease.Err(); !IsEngineStopped(err) || !contains(err.Error(), "crash", "killed") {
		t.Fatalf("lease error = %v", err)
	}
	h.waitState("a", StateFailed)
	m := h.model("a")
	if m.Failures != 1 || !contains(m.FailureReason, "killed") || m.LastUnload == nil ||
		m.LastUnload.Reason != ReasonCrash || m.LastUnload.Outcome != Indeterminate || m.LastUnload.FreedBytes != 3*gib {
		t.Fatalf("after crash: %+v (last unload %+v)", m, m.LastUnload)
	}
	if c := h.p.Snapshot().CommittedBytes; c != gib {
		t.Fatalf("committed %d after the crash, want only b's 1 GiB", c)
	}
	if got := h.state("b"); got != StateReady {
		t.Fatalf("another model's crash affected b: %s", got)
	}

	_, err := h.p.Acquire(h.ctx(), "a")
	status, code := statusOf(t, err)
	se, _ := AsStatusError(err)
	if status != http.StatusServiceUnavailable || code != CodeModelLoadFailed || se.RetryAfter() != time.Second {
		t.Fatalf("Acquire in backoff: %d %s retry %s", status, code, se.RetryAfter())
	}
	h.clk.Step(time.Second)
	h.acquire("a").Release()
	if n := len(h.f.Runners("a")); n != 2 {
		t.Fatalf("%d runners, want a reload after the backoff", n)
	}

	// A runner dying during its load fails it too, and the backoff grows.
	h.f.mu.Lock()
	h.f.manualReady = true
	h.f.mu.Unlock()
	h.f.last(t, "a").Crash(errors.New("ggml assert"))
	h.waitState("a", StateFailed)
	if m := h.model("a"); m.Failures != 2 || m.RetryAt.Sub(h.clk.Now()) != 2*time.Second {
		t.Fatalf("second crash: failures %d retry in %s, want 2 and 2s", m.Failures, m.RetryAt.Sub(h.clk.Now()))
	}
	h.clk.Step(2 * time.Second)
	go func() { h.f.waitRunner(t, "a", 3).FailLoad(errors.New("bad magic")) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = h.p.Acquire(ctx, "a")
	se, _ = AsStatusError(err)
	if se == nil || se.Code() != CodeModelLoadFailed || !contains(err.Error(), "bad magic") {
		t.Fatalf("load failure: %v", err)
	}
	h.waitState("a", StateFailed)
	if m := h.model("a"); m.Failures != 3 || m.RetryAt.Sub(h.clk.Now()) != 4*time.Second {
		t.Fatalf("third failure: failures %d retry in %s, want 3 and 4s", m.Failures, m.RetryAt.Sub(h.clk.Now()))
	}
}

func mustReturn(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s blocked: the pool lock is held across I/O", what)
	}
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// LeaseSeconds is the integral of the leases over time: its growth between two
// snapshots over the time between them is the mean number of active requests, even
// when no snapshot catches a request in flight.
func TestLeaseSecondsIntegratesTheLeases(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 1, OnDemand)
	h.acquire("a").Release() // loaded; no time passed
	start := h.model("a")
	if start.LeaseSeconds != 0 {
		t.Fatalf("leaseSeconds = %v after a lease held for no time, want 0", start.LeaseSeconds)
	}
	steps := []struct {
		hold    int           // leases held over the step
		d       time.Duration // the step
		wantAdd float64       // lease-seconds it adds
	}{
		{hold: 2, d: time.Second, wantAdd: 2},
		{hold: 0, d: 3 * time.Second, wantAdd: 0},
		{hold: 3, d: 500 * time.Millisecond, wantAdd: 1.5},
		{hold: 1, d: 2 * time.Second, wantAdd: 2},
	}
	want := 0.0
	for i, st := range steps {
		var held []*Lease
		for range st.hold {
			held = append(held, h.acquire("a"))
		}
		h.clk.Step(st.d)
		// A snapshot while the leases are held counts them up to its time.
		want += st.wantAdd
		if got := h.model("a").LeaseSeconds; got != want {
			t.Fatalf("step %d (%d leases for %v): leaseSeconds = %v while held, want %v", i, st.hold, st.d, got, want)
		}
		for _, l := range held {
			l.Release()
		}
		if got := h.model("a").LeaseSeconds; got != want {
			t.Fatalf("step %d: leaseSeconds = %v after the releases, want %v", i, got, want)
		}
	}
}

package enginepool

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// setAgent sets the agent's own footprint, the simplest lever on measured usage.
func (h *harness) setAgent(b int64) { h.g.setProc(fakeAgentPID, b) }

// Emergency: everything in flight is aborted, loads are aborted, and non-pinned
// models are unloaded; pinned ones stay.
func TestEmergencyPressureAbortsInFlightWork(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("pinned", 3, Pinned)
	h.register("busy", 3, OnDemand)
	h.register("loading", 2, OnDemand)
	h.load("pinned")
	h.load("busy")
	rp := h.startRequest("pinned", false)
	rb := h.startRequest("busy", false)
	h.f.mu.Lock()
	h.f.manualReady = true
	h.f.mu.Unlock()
	loadErr := make(chan error, 1)
	go func() { loadErr <- h.p.Load(h.ctx(), "loading") }()
	h.f.waitRunner(t, "loading", 1)

	h.setAgent(4 * gib) // 3+3+2+4 = 12 GiB = ceiling + 2 GiB
	h.p.enforcer.poll()
	if lvl := h.p.Snapshot().Pressure; lvl != PressureEmergency {
		t.Fatalf("pressure = %s, want emergency", lvl)
	}
	eventually(t, "in-flight requests to be aborted", func() bool { return rp.returned() && rb.returned() })
	err := <-loadErr
	if status, code := statusOf(t, err); status != http.StatusInsufficientStorage || code != CodeInsufficientMemory {
		t.Fatalf("aborted load: %d %s (%v)", status, code, err)
	}
	h.waitState("busy", StateUnloaded)
	h.waitState("loading", StateUnloaded)
	if got := h.state("pinned"); got != StateReady {
		t.Fatalf("pinned = %s, want it kept loaded", got)
	}
	if r := h.model("busy").LastUnload; r == nil || r.Reason != ReasonPressure {
		t.Fatalf("busy's unload %+v, want reason pressure", r)
	}
	if h.f.last(t, "pinned").Aborts() == 0 || h.f.last(t, "busy").Aborts() == 0 {
		t.Fatal("the runners' in-flight work was not aborted")
	}
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	if d := cmp.Diff([]PressureLevel{PressureEmergency}, h.obs.pressure); d != "" {
		t.Fatalf("pressure events (-want +got):\n%s", d)
	}
}

func TestEmergencyAfterTwoPollsAtTheCeiling(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("pinned", 3, Pinned)
	h.load("pinned")
	h.setAgent(7*gib + 100*mib) // 10.1 GiB: over the ceiling, under +2 GiB
	h.p.enforcer.poll()
	if lvl := h.p.Snapshot().Pressure; lvl != PressureHard {
		t.Fatalf("first poll: %s, want hard", lvl)
	}
	h.p.enforcer.poll()
	if lvl := h.p.Snapshot().Pressure; lvl != PressureEmergency {
		t.Fatalf("second poll: %s, want emergency", lvl)
	}
}

// Hard: loads in progress are aborted and idle victims evicted; with no idle victim
// the least recently used busy model has its requests aborted but stays loaded.
func TestHardPressure(t *testing.T) {
	t.Run("evicts an idle victim", func(t *testing.T) {
		h := newHarness(t, Config{})
		h.register("idle", 3, OnDemand)
		h.register("busy", 3, OnDemand)
		h.load("idle")
		h.load("busy")
		rq := h.startRequest("busy", false)
		defer rq.end()
		h.setAgent(3*gib + 600*mib) // 9.6 GiB
		h.p.enforcer.poll()
		h.waitState("idle", StateUnloaded)
		if got, aborts := h.state("busy"), h.f.last(t, "busy").Aborts(); got != StateReady || aborts != 0 {
			t.Fatalf("busy = %s with %d aborts; an idle victim existed", got, aborts)
		}
	})
	t.Run("aborts the LRU busy model when nothing is idle", func(t *testing.T) {
		h := newHarness(t, Config{})
		h.register("pinned", 3, Pinned)
		h.register("older", 2, OnDemand)
		h.register("newer", 2, OnDemand)
		h.register("loading", 1, OnDemand)
		h.load("pinned")
		h.load("older")
		h.load("newer")
		ro := h.startRequest("older", false)
		h.clk.Step(time.Second)
		rn := h.startRequest("newer", false)
		defer rn.end()
		h.f.mu.Lock()
		h.f.manualReady = true
		h.f.mu.Unlock()
		loadErr := make(chan error, 1)
		go func() { loadErr <- h.p.Load(h.ctx(), "loading") }()
		h.f.waitRunner(t, "loading", 1)

		h.setAgent(gib + 600*mib) // 3+2+2+1+1.6 = 9.6 GiB
		h.p.enforcer.poll()
		eventually(t, "older's request to be aborted", ro.returned)
		if err := <-loadErr; err == nil {
			t.Fatal("a load survived hard pressure")
		}
		if got := h.state("older"); got != StateReady {
			t.Fatalf("older = %s, want it kept loaded after the abort", got)
		}
		if a := h.f.last(t, "newer").Aborts(); a != 0 || rn.returned() {
			t.Fatalf("newer (more recently used) was aborted too")
		}
	})
}

// Soft: idle LRU models are evicted while more than one non-pinned model is loaded.
func TestSoftPressureEvictsIdleLRUWhileMoreThanOneNonPinned(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 2, OnDemand)
	h.register("b", 2, Resident)
	h.register("p", 2, Pinned)
	h.load("a")
	h.load("b")
	h.load("p")
	h.setAgent(3*gib + 200*mib) // 9.2 GiB: soft
	h.p.enforcer.poll()
	h.waitState("a", StateUnloaded)
	h.p.enforcer.poll() // still soft (the agent is large), but only b is non-pinned now
	if got := h.state("b"); got != StateReady {
		t.Fatalf("b = %s: the last non-pinned model was evicted at soft", got)
	}
	if r := h.model("a").LastUnload; r.Reason != ReasonPressure {
		t.Fatalf("a's unload reason %s", r.Reason)
	}
}

// Loads pause under pressure: at hard they are refused with a retry hint; at soft
// only a load that keeps the pool under the soft watermark is admitted.
func TestLoadsPauseUnderPressure(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("p", 3, Pinned)
	h.register("x", 1, OnDemand)
	h.load("p")
	h.setAgent(6*gib + 600*mib) // 9.6: hard
	h.p.enforcer.poll()
	_, err := h.p.Acquire(h.ctx(), "x")
	se, ok := AsStatusError(err)
	if !ok || se.HTTPStatus() != http.StatusInsufficientStorage || se.Code() != CodeInsufficientMemory ||
		se.RetryAfter() != 5*time.Second || !contains(err.Error(), "paused", "hard") {
		t.Fatalf("load under hard pressure: %v", err)
	}
	h.setAgent(5*gib + 200*mib) // 8.2: ok → x (1 GiB) would make 9.2 > soft, but fits the ceiling
	h.p.enforcer.poll()
	h.acquire("x").Release()
	if got := h.state("x"); got != StateReady {
		t.Fatalf("x = %s", got)
	}
	if _, err := h.p.Unload(h.ctx(), "x"); err != nil {
		t.Fatal(err)
	}
	h.setAgent(6*gib + 100*mib) // 9.1: soft → 10.1 > soft: paused
	h.p.enforcer.poll()
	_, err = h.p.Acquire(h.ctx(), "x")
	if se, ok := AsStatusError(err); !ok || se.Code() != CodeInsufficientMemory || !contains(err.Error(), "soft watermark") {
		t.Fatalf("load under soft pressure: %v", err)
	}
}

// Every poll pushes the current limits to every runner — including one loaded after
// the last pressure change, and one still loading.
func TestLimitsPushedToEveryRunnerEveryPoll(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 3, Pinned)
	h.register("b", 1, OnDemand)
	h.register("c", 1, OnDemand)
	h.load("a")
	h.setAgent(6*gib + 200*mib) // 9.2: soft
	h.p.enforcer.poll()
	h.setAgent(0) // back to ok: the last pressure change
	h.p.enforcer.poll()
	h.load("b") // loaded after it
	h.f.mu.Lock()
	h.f.manualReady = true
	h.f.mu.Unlock()
	go func() { _ = h.p.Load(h.ctx(), "c") }()
	rc := h.f.waitRunner(t, "c", 1)
	defer rc.MarkReady()

	h.p.enforcer.poll() // no change of level
	hard := h.p.Snapshot().Ceiling.HardBytes
	usage := int64(3*gib + 1*gib + 1*gib)
	for _, tc := range []struct {
		model string
		polls int
		want  Limits
	}{
		{"a", 3, Limits{CeilingBytes: runnerCeiling(3 * gib), HardLimitBytes: hard, HostUsedBytes: usage}},
		{"b", 1, Limits{CeilingBytes: runnerCeiling(1 * gib), HardLimitBytes: hard, HostUsedBytes: usage}},
		{"c", 1, Limits{CeilingBytes: runnerCeiling(1 * gib), HardLimitBytes: hard, HostUsedBytes: usage}},
	} {
		got := h.f.last(t, tc.model).Limits()
		if len(got) != tc.polls {
			t.Fatalf("%s got %d pushes, want one per poll since it started (%d)", tc.model, len(got), tc.polls)
		}
		if d := cmp.Diff(tc.want, got[len(got)-1]); d != "" {
			t.Fatalf("%s limits (-want +got):\n%s", tc.model, d)
		}
	}
}

// A runner over its own ceiling (its reservation) by more than 10% is a pressure
// victim; one within 10% is not.
func TestRunnerOverItsCeilingIsAPressureVictim(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("over", 2, Pinned)
	h.register("within", 2, OnDemand)
	h.load("over")
	h.load("within")
	h.g.addProc(h.f.last(t, "over").pid, 300*mib)   // +14.6%
	h.g.addProc(h.f.last(t, "within").pid, 150*mib) // +7.3%
	h.p.enforcer.poll()
	h.waitState("over", StateUnloaded)
	if r := h.model("over").LastUnload; r.Reason != ReasonOverCeiling {
		t.Fatalf("over's unload %+v", r)
	}
	if got := h.state("within"); got != StateReady {
		t.Fatalf("within = %s", got)
	}
}

// On a card with memory of its own the model is on the card and the host holds the
// accelerator runtime, whatever the model's size: a runner whose footprint at Ready
// is that runtime (5x its reservation) is not over its ceiling, and one that grows
// past it by more than its own ceiling is. On unified memory (a Mac) the same
// footprint is over the ceiling.
func TestRuntimeHostMemoryOnACardCountsInTheCeiling(t *testing.T) {
	for _, separate := range []bool{true, false} {
		t.Run(fmt.Sprintf("deviceSeparate=%v", separate), func(t *testing.T) {
			h := newHarness(t, Config{})
			h.f.deviceSeparate = separate
			h.f.footprint = func(s ModelSpec) int64 { return 5 * s.EstimatedBytes }
			if err := h.p.Register(ModelSpec{Name: "tiny", EstimatedBytes: 100 * mib, Residency: Pinned}); err != nil {
				t.Fatal(err)
			}
			h.load("tiny")
			h.p.enforcer.poll()
			if !separate {
				h.waitState("tiny", StateUnloaded)
				if r := h.model("tiny").LastUnload; r.Reason != ReasonOverCeiling {
					t.Fatalf("unload %+v, want over-ceiling", r)
				}
				return
			}
			if got := h.state("tiny"); got != StateReady {
				t.Fatalf("a runner whose footprint is its runtime was unloaded: %s (%+v)", got, h.model("tiny").LastUnload)
			}
			// 500 MiB at Ready, a ceiling of 110 MiB beyond it.
			h.g.addProc(h.f.last(t, "tiny").pid, 100*mib)
			h.p.enforcer.poll()
			if got := h.state("tiny"); got != StateReady {
				t.Fatalf("grew within its own ceiling beyond the runtime and was unloaded: %s", got)
			}
			h.g.addProc(h.f.last(t, "tiny").pid, 20*mib)
			h.p.enforcer.poll()
			h.waitState("tiny", StateUnloaded)
			if r := h.model("tiny").LastUnload; r.Reason != ReasonOverCeiling {
				t.Fatalf("unload %+v, want over-ceiling", r)
			}
		})
	}
}

// Idle expiry: OnDemand only (its own timeout or the agent default), never of a
// leased entry, whose idle clock restarts when the lease ends.
func TestIdleExpiryNeverOfALeasedEntry(t *testing.T) {
	h := newHarness(t, Config{IdleTimeout: 10 * time.Minute})
	if err := h.p.Register(ModelSpec{Name: "own", EstimatedBytes: gib, IdleTimeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	h.register("default", 1, OnDemand)
	h.register("resident", 1, Resident)
	h.register("pinned", 1, Pinned)
	for _, n := range []string{"own", "default", "resident", "pinned"} {
		h.load(n)
	}
	l := h.acquire("own")
	h.clk.Step(5 * time.Minute)
	h.p.enforcer.poll()
	if got := h.state("own"); got != StateReady {
		t.Fatalf("leased model expired: %s", got)
	}
	l.Release() // idle clock restarts now
	h.clk.Step(59 * time.Second)
	h.p.enforcer.poll()
	if got := h.state("own"); got != StateReady {
		t.Fatalf("expired %s after its lease ended, before its timeout", got)
	}
	h.clk.Step(time.Second)
	h.p.enforcer.poll()
	h.waitState("own", StateUnloaded)
	if r := h.model("own").LastUnload; r.Reason != ReasonIdle {
		t.Fatalf("reason %s", r.Reason)
	}

	h.clk.Step(10 * time.Minute)
	h.p.enforcer.poll()
	h.waitState("default", StateUnloaded)
	h.clk.Step(24 * time.Hour)
	h.p.enforcer.poll()
	for _, n := range []string{"resident", "pinned"} {
		if got := h.state(n); got != StateReady {
			t.Fatalf("%s = %s: Resident and Pinned models never expire", n, got)
		}
	}
}

func TestPollIntervalIsAdaptive(t *testing.T) {
	h := newHarness(t, Config{IdleTimeout: -1})
	if d := h.p.enforcer.interval(); d != 30*time.Second {
		t.Fatalf("empty: %s", d)
	}
	h.register("r", 1, Resident)
	h.load("r")
	if d := h.p.enforcer.interval(); d != 10*time.Second {
		t.Fatalf("loaded, idle: %s", d)
	}
	if err := h.p.Register(ModelSpec{Name: "od", EstimatedBytes: gib, IdleTimeout: 4 * time.Second}); err != nil {
		t.Fatal(err)
	}
	h.acquire("od").Release()
	h.clk.Step(time.Second)
	if d := h.p.enforcer.interval(); d != 3*time.Second {
		t.Fatalf("next idle expiry in 3s: %s", d)
	}
	l := h.acquire("r")
	if d := h.p.enforcer.interval(); d != time.Second {
		t.Fatalf("serving: %s", d)
	}
	l.Release()
	h.setAgent(8 * gib)
	h.p.enforcer.poll()
	if d := h.p.enforcer.interval(); d != time.Second {
		t.Fatalf("under pressure: %s", d)
	}
}

// Run polls at once, is woken by loads and unloads, and brings a poll forward to
// PollActive when a request starts on an idle pool.
func TestRunWakesOnLoadUnloadAndRequestStart(t *testing.T) {
	h := newHarness(t, Config{IdleTimeout: -1})
	h.register("a", 1, Resident)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- h.p.Run(ctx) }()
	eventually(t, "the first poll", func() bool { return !h.p.Snapshot().LastPoll.IsZero() })

	h.acquire("a").Release() // the load wakes the enforcer: no clock step needed
	r := h.f.last(t, "a")
	eventually(t, "a poll after the load", func() bool { return len(r.Limits()) >= 1 })
	n := len(r.Limits())

	h.clk.Step(time.Second) // idle: the next poll is 10s away
	h.acquire("a").Release()
	eventually(t, "a poll brought forward by the request", func() bool {
		if len(r.Limits()) > n {
			return true
		}
		h.clk.Step(100 * time.Millisecond)
		return false
	})
	if el := h.clk.Since(epoch); el >= 10*time.Second {
		t.Fatalf("the request did not bring the poll forward (clock at +%s)", el)
	}

	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if got := h.state("a"); got != StateUnloaded {
		t.Fatalf("a = %s after Run returned, want Unloaded", got)
	}
}

package enginepool

import (
	"testing"
	"time"
)

// The settle barrier never reads a global gauge as if it were alone: while another
// model serves, it reports Indeterminate at once (no stall of the serving engine),
// never a negative figure, and it holds no lock while it waits.
func TestSettleIndeterminateNeverNegativeNeverStalls(t *testing.T) {
	t.Run("another model serving", func(t *testing.T) {
		h := newHarness(t, Config{})
		h.register("a", 3, OnDemand)
		h.register("b", 3, OnDemand)
		h.load("a")
		h.load("b")
		rq := h.startRequest("b", false)
		defer rq.end()
		h.g.mu.Lock()
		h.g.onHost = func(g *fakeGauge) { g.extra += gib } // b's KV grows faster than a frees
		h.g.mu.Unlock()

		var rep *UnloadReport
		mustReturn(t, "unloading a while b serves", func() {
			var err error
			rep, err = h.p.Unload(h.ctx(), "a") // no clock step: must not wait
			if err != nil {
				t.Error(err)
			}
		})
		if rep == nil || rep.Outcome != Indeterminate || rep.FreedBytes != 3*gib || rep.ResidentBytes != 3*gib || rep.Duration != 0 {
			t.Fatalf("report %+v: want Indeterminate carrying a's 3 GiB footprint, at once", rep)
		}
	})
	t.Run("a request arriving mid-settle", func(t *testing.T) {
		h := newHarness(t, Config{})
		h.register("a", 3, OnDemand)
		h.register("b", 3, OnDemand)
		h.load("a")
		h.load("b")
		h.g.setLag(-1) // the gauge never shows a's memory back: the barrier keeps sampling

		before := hostCalls(h.g)
		done, err := h.p.StartUnload("a")
		if err != nil {
			t.Fatal(err)
		}
		// The pre sample, then the barrier's first sample; then it waits.
		eventually(t, "the settle barrier to sample", func() bool { return hostCalls(h.g) >= before+2 })
		if st := h.state("a"); st != StateStopping {
			t.Fatalf("a = %s, want Stopping (settling)", st)
		}
		mustReturn(t, "serving b during a's settle", func() {
			rq := h.startRequest("b", false)
			rq.end()
		})
		h.stepUntil("the barrier to notice b", 250*time.Millisecond, func() bool { return isClosed(done) })
		rep := h.model("a").LastUnload
		if rep == nil || rep.Outcome != Indeterminate || rep.FreedBytes != 3*gib || rep.Duration >= time.Second {
			t.Fatalf("report %+v: want Indeterminate within a sample or two", rep)
		}
	})
}

func TestSettleIndeterminateWhileAnotherModelLoads(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 3, OnDemand)
	h.register("b", 3, OnDemand)
	h.load("a")
	h.f.mu.Lock()
	h.f.manualReady = true
	h.f.mu.Unlock()
	go func() { _ = h.p.Load(h.ctx(), "b") }()
	rb := h.f.waitRunner(t, "b", 1)
	defer rb.MarkReady()

	rep, err := h.p.Unload(h.ctx(), "a")
	if err != nil || rep == nil || rep.Outcome != Indeterminate || rep.FreedBytes != 3*gib {
		t.Fatalf("report %+v, %v", rep, err)
	}
}

func TestSettleOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resident  int64
		freed     int64 // what the host gauge gives back, for good
		want      SettleOutcome
		wantFreed int64
	}{
		{name: "all back", resident: 3 * gib, freed: 3 * gib, want: Settled, wantFreed: 3 * gib},
		{name: "within the 256 MiB floor", resident: 3 * gib, freed: 3*gib - 200*mib, want: Settled, wantFreed: 3*gib - 200*mib},
		{name: "within 5% of a large runner", resident: 20 * gib, freed: 20*gib - 900*mib, want: Settled, wantFreed: 20*gib - 900*mib},
		{name: "outside 5%", resident: 20 * gib, freed: 20*gib - 1200*mib, want: TimedOut, wantFreed: 20*gib - 1200*mib},
		{name: "nothing back", resident: 3 * gib, freed: 0, want: TimedOut, wantFreed: 0},
		{name: "usage grew: never negative", resident: 3 * gib, freed: -2 * gib, want: TimedOut, wantFreed: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{})
			const pre = 30 * gib
			h.g.mu.Lock()
			h.g.base = pre - tc.freed
			h.g.mu.Unlock()
			type result struct {
				o SettleOutcome
				f int64
			}
			got := make(chan result, 1)
			start := h.clk.Now()
			go func() {
				o, f := h.p.unloader.settle(nil, 0, pre, tc.resident)
				got <- result{o, f}
			}()
			var r result
			h.stepUntil("the settle barrier", 250*time.Millisecond, func() bool {
				select {
				case r = <-got:
					return true
				default:
					return false
				}
			})
			if r.o != tc.want || r.f != tc.wantFreed {
				t.Fatalf("settle = %s %d, want %s %d", r.o, r.f, tc.want, tc.wantFreed)
			}
			if el := h.clk.Since(start); tc.want == TimedOut && el < 5*time.Second {
				t.Fatalf("timed out after %s, want 5s", el)
			}
		})
	}
}

// The reservation is released only after the settle barrier, and a TimedOut
// barrier reports what did come back.
func TestReservationReleasedOnlyAfterSettle(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 3, OnDemand)
	h.load("a")
	h.g.setLag(-1)
	done, err := h.p.StartUnload("a")
	if err != nil {
		t.Fatal(err)
	}
	h.waitState("a", StateStopping)
	for range 10 { // 2.5s into the 5s barrier
		h.clk.Step(250 * time.Millisecond)
		if c := h.p.Snapshot().CommittedBytes; c != 3*gib || isClosed(done) {
			t.Fatalf("reservation released (committed %d) before the barrier ended", c)
		}
	}
	h.stepUntil("the barrier to time out", 250*time.Millisecond, func() bool { return isClosed(done) })
	rep := h.model("a").LastUnload
	if rep.Outcome != TimedOut || rep.FreedBytes != 0 || rep.Duration < 5*time.Second {
		t.Fatalf("report %+v", rep)
	}
	if c := h.p.Snapshot().CommittedBytes; c != 0 {
		t.Fatalf("committed %d after the barrier", c)
	}
}

func hostCalls(g *fakeGauge) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.hostCalls
}

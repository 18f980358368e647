package enginepool

import (
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Admission evicts idle models down to the soft target *before* the new runner
// starts, instead of loading first and evicting after (the swap storm).
func TestAdmissionEvictsDownToSoftTargetBeforeLoading(t *testing.T) {
	for _, tc := range []struct {
		name    string
		loadGiB float64
		evicted []string
		kept    []string
	}{
		// 3+3+2 loaded, +3 → 11 > 9 (soft): a (LRU, 3 GiB) alone frees the 2 GiB.
		{name: "one victim", loadGiB: 3, evicted: []string{"a"}, kept: []string{"b", "c"}},
		// +6 → 14: nothing frees 5 alone, so the largest (a, older of the 3 GiB
		// pair) goes; 11 is still over 9, so b goes too; 8 fits.
		{name: "two victims", loadGiB: 6, evicted: []string{"a", "b"}, kept: []string{"c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{})
			h.register("a", 3, OnDemand)
			h.register("b", 3, OnDemand)
			h.register("c", 2, OnDemand)
			h.register("d", tc.loadGiB, OnDemand)
			h.load("a")
			h.load("b")
			h.load("c")

			h.acquire("d").Release()
			ev := h.f.Events()
			start := indexOf(ev, "start:d")
			for _, v := range tc.evicted {
				if i := indexOf(ev, "stop:"+v); i < 0 || i > start {
					t.Fatalf("events %v: %s must be stopped before d starts", ev, v)
				}
				if r := h.model(v).LastUnload; r == nil || r.Reason != ReasonEviction {
					t.Fatalf("%s: last unload %+v, want reason eviction", v, r)
				}
			}
			for _, k := range tc.kept {
				if got := h.state(k); got != StateReady {
					t.Fatalf("%s = %s, want it kept Ready", k, got)
				}
			}
			if s := h.p.Snapshot(); s.CommittedBytes > s.Ceiling.SoftBytes || s.Evictions != int64(len(tc.evicted)) {
				t.Fatalf("committed %d (soft %d), evictions %d", s.CommittedBytes, s.Ceiling.SoftBytes, s.Evictions)
			}
		})
	}
}

// 507 model_too_large names the binding ceiling and its fix, and a model that can
// never fit does not evict anything on its way to the error.
func TestModelTooLargeNamesTheBindingCeiling(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hw         Hardware
		configured int64
		bound      CeilingBound
		ceiling    int64
		says       []string
	}{
		{name: "configured", hw: Hardware{TotalBytes: 64 * gib}, configured: 10 * gib, bound: BoundConfigured, ceiling: 10 * gib,
			says: []string{"configured ceiling of 10.0 GiB", "raise the configured memory ceiling"}},
		{name: "static", hw: Hardware{TotalBytes: 16 * gib}, configured: -1, bound: BoundStatic, ceiling: 12 * gib,
			says: []string{"static ceiling", "16.0 GiB of memory minus a 4.0 GiB reserve", "--memory-reserve"}},
		{name: "metal working set", hw: Hardware{TotalBytes: 32 * gib, MetalWorkingSetBytes: 21 * gib}, configured: -1,
			bound: BoundMetalWorkingSet, ceiling: 21 * gib, says: []string{"Metal recommended working set of 21.0 GiB", "iogpu.wired_limit_mb"}},
		{name: "wired limit", hw: Hardware{TotalBytes: 32 * gib, MetalWorkingSetBytes: 21 * gib, WiredLimitBytes: 20 * gib}, configured: -1,
			bound: BoundWiredLimit, ceiling: 20 * gib, says: []string{"iogpu.wired_limit_mb = 20480", "raise the wired limit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessHW(t, Config{CeilingBytes: tc.configured}, tc.hw)
			h.register("small", 1, OnDemand)
			h.register("huge", float64(tc.ceiling+gib)/float64(gib), OnDemand)
			h.load("small")

			_, err := h.p.Acquire(h.ctx(), "huge")
			status, code := statusOf(t, err)
			if status != http.StatusInsufficientStorage || code != CodeModelTooLarge {
				t.Fatalf("got %d %s (%v)", status, code, err)
			}
			if !contains(err.Error(), tc.says...) {
				t.Fatalf("message %q does not say %q", err, tc.says)
			}
			se, _ := AsStatusError(err)
			want := map[string]any{"estimated_bytes": tc.ceiling + gib, "limit_bytes": tc.ceiling, "ceiling_bound": string(tc.bound)}
			if d := cmp.Diff(want, se.Fields()); d != "" {
				t.Fatalf("fields (-want +got):\n%s", d)
			}
			if got := h.state("small"); got != StateReady {
				t.Fatalf("small = %s: a hopeless admission evicted it", got)
			}
			if got := h.state("huge"); got != StateAbsent {
				t.Fatalf("huge = %s after a refused load, want Absent", got)
			}
		})
	}
}

// Admission is whole-host: it counts what co-resident models measure, not only
// their estimates, and names what holds the memory.
func TestWholeHostAdmissionCountsCoResidentModels(t *testing.T) {
	h := newHarness(t, Config{})
	h.f.footprint = func(s ModelSpec) int64 {
		if s.Name == "a" {
			return 6 * gib // it grew past its 4 GiB estimate
		}
		return s.EstimatedBytes
	}
	h.register("a", 4, Pinned)
	h.register("b", 4.5, OnDemand)
	h.load("a")

	_, err := h.p.Acquire(h.ctx(), "b") // committed 8.5 fits; measured 10.5 does not
	status, code := statusOf(t, err)
	if status != http.StatusInsufficientStorage || code != CodeInsufficientMemory {
		t.Fatalf("got %d %s (%v)", status, code, err)
	}
	var ie *InsufficientMemoryError
	if !asErr(err, &ie) || ie.CurrentBytes != 6*gib || ie.LimitBytes != 10*gib || !contains(err.Error(), "a (pinned)", "configured ceiling") {
		t.Fatalf("error %+v: %v", ie, err)
	}
}

// Reservations count in admission: a second large model is refused while the first
// is still loading and invisible to the gauges.
func TestAdmissionCountsCommittedReservations(t *testing.T) {
	h := newHarness(t, Config{})
	h.f.manualReady = true
	h.f.lagOnLoad = true
	h.register("a", 6, OnDemand)
	h.register("b", 6, OnDemand)
	go func() {
		if l, err := h.p.Acquire(h.ctx(), "a"); err == nil {
			l.Release()
		}
	}()
	r := h.f.waitRunner(t, "a", 1)
	if fp, _ := h.g.Process(r.pid); fp != 0 {
		t.Fatalf("the loading runner is visible to the gauge (%d): the test needs a lagging gauge", fp)
	}

	_, err := h.p.Acquire(h.ctx(), "b")
	if status, code := statusOf(t, err); status != http.StatusInsufficientStorage || code != CodeInsufficientMemory {
		t.Fatalf("b admitted next to a loading a: %d %s (%v)", status, code, err)
	}
	if !contains(err.Error(), "a (loading)") || len(h.f.Runners("b")) != 0 {
		t.Fatalf("error %v; runners of b %d", err, len(h.f.Runners("b")))
	}
	r.MarkReady()
	h.waitState("a", StateReady)
}

// Evicted models come back on the next request (no restart needed), and every
// eviction reports what it measurably freed.
func TestEvictedModelsReloadAndReportFreedBytes(t *testing.T) {
	h := newHarness(t, Config{})
	h.g.setLag(2) // the host gauge gives memory back two samples after exit
	h.register("a", 6, OnDemand)
	h.register("b", 6, OnDemand)
	h.load("a")

	got := make(chan error, 1)
	go func() {
		l, err := h.p.Acquire(h.ctx(), "b")
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	// The settle barrier samples every 250ms of the fake clock.
	h.stepUntil("a's eviction to settle", 250*time.Millisecond, func() bool { return len(h.obs.Unloads("a")) > 0 })
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	reps := h.obs.Unloads("a")
	if len(reps) != 1 {
		t.Fatalf("reports for a: %+v", reps)
	}
	r := reps[0]
	if r.Reason != ReasonEviction || r.Outcome != Settled || r.FreedBytes != 6*gib || r.ResidentBytes != 6*gib ||
		r.Duration < 500*time.Millisecond || r.Duration >= 5*time.Second {
		t.Fatalf("report %+v", r)
	}
	if s := h.p.Snapshot(); s.Evictions != 1 || s.FreedBytesTotal != 6*gib {
		t.Fatalf("evictions %d freed %d", s.Evictions, s.FreedBytesTotal)
	}

	h.g.setLag(0)
	h.clk.Step(time.Second)
	h.acquire("a").Release()
	if got, n := h.state("b"), len(h.f.Runners("a")); got != StateUnloaded || n != 2 {
		t.Fatalf("b = %s, runners of a %d: want a reloaded in b's place", got, n)
	}
}

// Admission waits for unloads already under way rather than refusing a load that
// fits once their reservations come back.
func TestAdmissionWaitsForUnloadsInProgress(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 6, OnDemand)
	h.register("b", 6, OnDemand)
	h.load("a")
	rq := h.startRequest("a", true)
	if _, err := h.p.StartUnload("a"); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := h.p.Acquire(h.ctx(), "b")
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	h.waitState("b", StateLoading)
	rq.end()
	if err := <-got; err != nil {
		t.Fatalf("b: %v", err)
	}
	if s := h.p.Snapshot(); s.CommittedBytes != 6*gib {
		t.Fatalf("committed %d, want b's 6 GiB only", s.CommittedBytes)
	}
}

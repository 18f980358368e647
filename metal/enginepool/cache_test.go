package enginepool

import (
	"testing"
)

// Cache clear reaches every live runner — including one whose model was removed
// while a request still drains it — and runner exit gives everything back: with
// nothing loaded, nothing is held and the largest model that fits is admitted.
func TestCacheClearReachesEveryRunnerAndExitReclaims(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 3, OnDemand)
	h.register("b", 3, OnDemand)
	h.register("big", 9.5, OnDemand)
	h.load("a")
	h.load("b")
	ra, rb := h.f.last(t, "a"), h.f.last(t, "b")
	ra.growCache(gib)
	rb.growCache(512 * mib)

	rq := h.startRequest("a", true)
	removed, err := h.p.Remove("a") // its owner goes away while the engine drains
	if err != nil {
		t.Fatal(err)
	}
	rep := h.p.ClearCache(h.ctx())
	if ra.Clears() != 1 || rb.Clears() != 1 {
		t.Fatalf("clears: a %d, b %d; want every runner cleared once", ra.Clears(), rb.Clears())
	}
	want := []RunnerCacheClear{
		{Model: "a", PID: ra.pid, BytesReclaimed: gib, ReportedBytes: gib, EntriesCleared: 1},
		{Model: "b", PID: rb.pid, BytesReclaimed: 512 * mib, ReportedBytes: 512 * mib, EntriesCleared: 1},
	}
	if rep.BytesReclaimed != gib+512*mib || len(rep.Runners) != 2 || rep.Runners[0] != want[0] || rep.Runners[1] != want[1] {
		t.Fatalf("report %+v", rep)
	}

	rq.end()
	eventually(t, "a's removal", func() bool { return isClosed(removed) })
	if _, err := h.p.Unload(h.ctx(), "b"); err != nil {
		t.Fatal(err)
	}
	h.p.enforcer.poll()
	s := h.p.Snapshot()
	if s.Runners != 0 || s.CommittedBytes != 0 || s.UsageBytes != 0 {
		t.Fatalf("with nothing loaded: runners %d committed %d usage %d", s.Runners, s.CommittedBytes, s.UsageBytes)
	}
	if hm, _ := h.g.Host(); hm.UsedBytes != 0 {
		t.Fatalf("host still holds %d bytes after every runner exited", hm.UsedBytes)
	}
	h.acquire("big").Release()
}

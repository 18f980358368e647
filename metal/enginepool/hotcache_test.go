package enginepool

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
)

func TestShareHot(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int64
		caps   []int64
		want   []int64
	}{
		{"nobody", 100, nil, []int64{}},
		{"one takes all", 100, []int64{0}, []int64{100}},
		{"equal split", 100, []int64{0, 0}, []int64{50, 50}},
		{"remainder goes to the last uncapped", 100, []int64{0, 0, 0}, []int64{33, 33, 34}},
		{"a cap leaves the rest to the others", 100, []int64{10, 0, 0}, []int64{10, 45, 45}},
		{"caps below the share", 100, []int64{10, 20}, []int64{10, 20}},
		{"a cap above the equal share", 100, []int64{80, 0}, []int64{50, 50}},
		{"no budget", 0, []int64{0, 5}, []int64{0, 0}},
		{"negative budget is none", -5, []int64{0}, []int64{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := shareHot(tc.budget, tc.caps)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Fatalf("shareHot(%d, %v) (-want +got):\n%s", tc.budget, tc.caps, d)
			}
			sum := int64(0)
			for _, s := range got {
				sum += s
			}
			if sum > max(tc.budget, 0) {
				t.Fatalf("shares sum to %d, over the budget %d", sum, tc.budget)
			}
		})
	}
}

// registerCached registers a model whose prompt cache is enabled, its hot share
// capped at capBytes (0: no cap).
func (h *harness) registerCached(name string, estGiB float64, res Residency, capBytes int64) {
	h.t.Helper()
	spec := ModelSpec{Name: name, Path: "/models/" + name + ".gguf", EstimatedBytes: int64(estGiB * float64(gib)), Residency: res,
		PromptCache: PromptCacheSpec{Enabled: true, HotBytes: capBytes}}
	if err := h.p.Register(spec); err != nil {
		h.t.Fatal(err)
	}
}

// The agent's hot budget is shared among the Ready runners whose model enables the
// cache, capped by each model's own hotBytes, and moves when models load and unload;
// each share counts in its runner's own ceiling.
func TestHotBudgetIsSharedAndMovesWithLoadsAndUnloads(t *testing.T) {
	h := newHarness(t, Config{PromptCacheHotBytes: 2 * gib})
	h.registerCached("a", 1, OnDemand, 0)
	h.registerCached("b", 1, OnDemand, 0)
	h.registerCached("capped", 1, OnDemand, 256*mib)
	h.register("off", 1, OnDemand) // cache disabled: no share, never told

	budgets := func() map[string]int64 {
		out := map[string]int64{}
		for _, n := range []string{"a", "b", "capped", "off"} {
			if rs := h.f.Runners(n); len(rs) > 0 && h.state(n) == StateReady {
				out[n] = rs[len(rs)-1].HotBudget()
			}
		}
		return out
	}
	check := func(step string, want map[string]int64) {
		t.Helper()
		h.p.enforcer.poll()
		if d := cmp.Diff(want, budgets()); d != "" {
			t.Fatalf("%s: budgets the runners were told (-want +got):\n%s", step, d)
		}
	}

	h.load("a")
	check("a alone", map[string]int64{"a": 2 * gib})
	h.load("off")
	check("a disabled model loads", map[string]int64{"a": 2 * gib, "off": 0})
	h.load("b")
	check("b loads", map[string]int64{"a": gib, "b": gib, "off": 0})
	h.load("capped")
	check("a capped model loads", map[string]int64{"a": gib - 128*mib, "b": gib - 128*mib, "capped": 256 * mib, "off": 0})
	if got := h.f.last(t, "off").Budgets(); len(got) != 0 {
		t.Fatalf("the runner of a model without the cache was told budgets %v", got)
	}
	// A share counts in the runner's own ceiling.
	if got, want := h.f.last(t, "capped").Limits(), runnerCeiling(gib)+256*mib; got[len(got)-1].CeilingBytes != want {
		t.Fatalf("capped's ceiling %d, want reservation+10%%+share %d", got[len(got)-1].CeilingBytes, want)
	}
	if m := h.model("capped"); m.PromptCache == nil || m.PromptCache.HotShareBytes != 256*mib || m.PromptCache.HotBudgetBytes != 256*mib {
		t.Fatalf("capped's snapshot %+v, want a share and budget of 256Mi", m.PromptCache)
	}

	// Decreases are told before increases: the runners never hold more than the budget.
	ra := h.f.last(t, "a")
	if _, err := h.p.Unload(h.ctx(), "b"); err != nil {
		t.Fatal(err)
	}
	check("b unloaded", map[string]int64{"a": 2*gib - 256*mib, "capped": 256 * mib, "off": 0})
	if _, err := h.p.Unload(h.ctx(), "capped"); err != nil {
		t.Fatal(err)
	}
	check("capped unloaded", map[string]int64{"a": 2 * gib, "off": 0})
	if d := cmp.Diff([]int64{2 * gib, gib, gib - 128*mib, 2*gib - 256*mib, 2 * gib}, ra.Budgets()); d != "" {
		t.Fatalf("a's budgets over time (-want +got):\n%s", d)
	}
	var order []string
	for _, ev := range h.f.Events() {
		if strings.HasPrefix(ev, "budget:") {
			order = append(order, ev)
		}
	}
	// When capped loaded, a and b shrank before capped got its share.
	i := slices.Index(order, "budget:capped=268435456")
	j := slices.Index(order, "budget:a=939524096")
	k := slices.Index(order, "budget:b=939524096")
	if i < 0 || j < 0 || k < 0 || i < j || i < k {
		t.Fatalf("budget pushes %v: want a and b shrunk before capped's share", order)
	}
}

// The hot budget handed out is bounded by what the reservations leave below the soft
// watermark.
func TestHotBudgetLeavesTheReservationsTheirRoom(t *testing.T) {
	h := newHarness(t, Config{PromptCacheHotBytes: 4 * gib}) // soft 9 GiB
	h.registerCached("big", 7, Pinned, 0)
	h.load("big")
	h.p.enforcer.poll()
	if got := h.f.last(t, "big").HotBudget(); got != 2*gib {
		t.Fatalf("budget %d, want the 2 GiB left below the soft watermark", got)
	}
	if got := h.p.Snapshot().Models[0].PromptCache.HotShareBytes; got != 2*gib {
		t.Fatalf("snapshot share %d", got)
	}
}

// Under hard pressure the enforcer shrinks every hot tier to zero before it aborts any
// request; only when that does not bring usage down does it abort the LRU busy model.
// The hot tiers come back once pressure is ok.
func TestHardPressureShrinksHotTiersBeforeAborting(t *testing.T) {
	h := newHarness(t, Config{PromptCacheHotBytes: 2 * gib}) // soft 9, hard 9.5 GiB
	h.registerCached("x", 2, Pinned, 0)
	h.registerCached("y", 2, Pinned, 0)
	h.load("x")
	h.load("y")
	h.p.enforcer.poll()
	rx, ry := h.f.last(t, "x"), h.f.last(t, "y")
	rx.fillHot(gib)
	ry.fillHot(gib)
	h.p.RefreshPromptCacheStats()
	reqX := h.startRequest("x", false)
	defer reqX.end()
	reqY := h.startRequest("y", false)
	defer reqY.end()

	// 2+1 + 2+1 + 3.6 = 9.6 GiB: hard. Shrinking the hot tiers gives back 2 GiB.
	h.setAgent(3*gib + 600*mib)
	h.p.enforcer.poll()
	if lvl := h.p.Snapshot().Pressure; lvl != PressureHard {
		t.Fatalf("pressure %s, want hard", lvl)
	}
	if rx.HotBudget() != 0 || ry.HotBudget() != 0 || rx.HotBytes() != 0 || ry.HotBytes() != 0 {
		t.Fatalf("hot tiers not shrunk: budgets %d %d, bytes %d %d", rx.HotBudget(), ry.HotBudget(), rx.HotBytes(), ry.HotBytes())
	}
	if rx.Aborts()+ry.Aborts() != 0 || reqX.returned() || reqY.returned() {
		t.Fatal("requests were aborted although shrinking the hot tiers was enough")
	}
	h.p.enforcer.poll() // 7.6 GiB now: soft, not hard; the tiers stay shrunk
	if lvl := h.p.Snapshot().Pressure; lvl != PressureOK {
		// 2+2+3.6 = 7.6 < 9 (soft): ok, and the shares come back.
		t.Fatalf("pressure %s after the shrink, want ok", lvl)
	}
	h.p.enforcer.poll()
	if rx.HotBudget() != gib || ry.HotBudget() != gib {
		t.Fatalf("budgets after pressure ended: %d %d, want 1 GiB each", rx.HotBudget(), ry.HotBudget())
	}

	// Hard again with the hot tiers empty: nothing to shrink, so the LRU busy model
	// has its requests aborted — after its budget was taken to zero.
	h.setAgent(5*gib + 600*mib) // 4 + 5.6 = 9.6
	h.p.enforcer.poll()
	eventually(t, "the LRU busy model's requests to be aborted", func() bool { return reqX.returned() })
	var budgetAt, abortAt = -1, -1
	for i, ev := range h.f.Events() {
		switch ev {
		case "budget:x=0":
			budgetAt = i
		case "abort:x":
			abortAt = i
		}
	}
	if budgetAt < 0 || abortAt < 0 || budgetAt > abortAt {
		t.Fatalf("events %v: want x's budget at 0 before its abort", h.f.Events())
	}
}

// A runner's hot budget counts in its own ceiling: a footprint within reservation +
// 10% + budget is not over its ceiling.
func TestHotBudgetCountsInTheRunnersCeiling(t *testing.T) {
	h := newHarness(t, Config{PromptCacheHotBytes: gib})
	h.registerCached("cached", 2, OnDemand, 0)
	h.load("cached")
	h.p.enforcer.poll()
	r := h.f.last(t, "cached")
	r.fillHot(gib) // 2 GiB + 1 GiB of hot tier: +50% over the reservation
	h.p.enforcer.poll()
	if got := h.state("cached"); got != StateReady {
		t.Fatalf("a runner holding its hot budget was unloaded: %s", got)
	}
	h.g.addProc(r.pid, 300*mib) // beyond reservation + 10% + budget
	h.p.enforcer.poll()
	h.waitState("cached", StateUnloaded)
	if rep := h.model("cached").LastUnload; rep.Reason != ReasonOverCeiling {
		t.Fatalf("unload %+v, want over-ceiling", rep)
	}
}

// A runner that serves its model without the prompt cache (a recurrent state cannot
// be cut back to a prefix) reports why: the pool records the path and its reason in
// the model's snapshot, plans it no hot share and never tells it a budget (it would
// answer 409 every poll); the other runners share the whole budget.
func TestRunnerWithoutPromptCacheGetsNoHotShare(t *testing.T) {
	off := []runnerapi.PathOff{{Path: runnerapi.PathPromptCache, Reason: "off: the model keeps a recurrent state (test)"}}
	h := newHarness(t, Config{PromptCacheHotBytes: 2 * gib})
	h.f.off = func(s ModelSpec) []runnerapi.PathOff {
		if s.Name == "recurrent" {
			return off
		}
		return nil
	}
	h.registerCached("a", 1, OnDemand, 0)
	h.registerCached("recurrent", 1, OnDemand, 0)
	h.load("a")
	h.load("recurrent")
	h.p.RefreshPromptCacheStats()
	for range 3 {
		h.p.enforcer.poll()
	}

	if got := h.f.last(t, "recurrent").Budgets(); len(got) != 0 {
		t.Fatalf("the runner without a prompt cache was told budgets %v", got)
	}
	if got := h.f.last(t, "a").HotBudget(); got != 2*gib {
		t.Fatalf("a's budget %d, want the whole 2Gi", got)
	}
	m := h.model("recurrent")
	if d := cmp.Diff(off, m.Off); d != "" {
		t.Fatalf("recurrent's snapshot paths off (-want +got):\n%s", d)
	}
	if m.PromptCache != nil && m.PromptCache.HotShareBytes != 0 {
		t.Fatalf("recurrent's snapshot %+v, want no hot share", m.PromptCache)
	}
	if got := h.model("a").Off; got != nil {
		t.Fatalf("a's snapshot paths off %v, want none", got)
	}
	// Kept after an unload, as the cache report is.
	if _, err := h.p.Unload(h.ctx(), "recurrent"); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(off, h.model("recurrent").Off); d != "" {
		t.Fatalf("recurrent's paths off after its unload (-want +got):\n%s", d)
	}
}

// A runner polled before it reported its paths off is told a budget at most once:
// its refusal leaves no budget held, and its report takes it out of the plan.
func TestRunnerWithoutPromptCacheIsToldABudgetAtMostOnce(t *testing.T) {
	h := newHarness(t, Config{PromptCacheHotBytes: 2 * gib})
	h.f.off = func(ModelSpec) []runnerapi.PathOff {
		return []runnerapi.PathOff{{Path: runnerapi.PathPromptCache, Reason: "off (test)"}}
	}
	h.registerCached("recurrent", 1, OnDemand, 0)
	h.load("recurrent")
	for range 4 {
		h.p.enforcer.poll()
	}
	if got := h.f.last(t, "recurrent").Budgets(); len(got) > 1 {
		t.Fatalf("the runner without a prompt cache was told budgets %v, want at most one", got)
	}
	if got := h.model("recurrent").Off; len(got) != 1 || got[0].Path != runnerapi.PathPromptCache {
		t.Fatalf("recurrent's paths off %v, want the prompt cache", got)
	}
}

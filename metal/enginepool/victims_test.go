package enginepool

import (
	"testing"

	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// Candidates are Ready, unpinned, unleased and not the model being admitted;
// Loading and Draining entries never are.
func TestVictimCandidates(t *testing.T) {
	h := newHarness(t, Config{CeilingBytes: 40 * gib})
	for _, n := range []string{"idle", "leased", "pinned", "draining", "loading"} {
		res := OnDemand
		if n == "pinned" {
			res = Pinned
		}
		h.register(n, 1, res)
	}
	h.register("resident", 1, Resident)
	for _, n := range []string{"idle", "leased", "pinned", "draining", "resident"} {
		h.load(n)
	}
	l := h.acquire("leased")
	defer l.Release()
	rq := h.startRequest("draining", true)
	defer rq.end()
	if _, err := h.p.StartUnload("draining"); err != nil {
		t.Fatal(err)
	}
	h.f.mu.Lock()
	h.f.manualReady = true
	h.f.mu.Unlock()
	go func() { _ = h.p.Load(h.ctx(), "loading") }()
	h.f.waitRunner(t, "loading", 1)

	cands := decide.Candidates(h.p.st.view(query{decide: true}).snap.Models, "idle")
	var names []string
	for _, c := range cands {
		names = append(names, c.Name)
	}
	if len(names) != 1 || names[0] != "resident" {
		t.Fatalf("candidates (excluding idle as the admitted one) = %v, want [resident]", names)
	}
}

// Eviction is size-aware LRU: the least recently used model that alone makes room
// goes, not a small one that would force a second eviction, and not simply the
// largest.
func TestSizeAwareLRUEviction(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("x", 1, OnDemand) // least recently used, too small alone
	h.register("y", 4, OnDemand) // next LRU, big enough
	h.register("z", 2, OnDemand)
	h.register("w", 5, OnDemand)
	h.load("x")
	h.load("y")
	h.load("z")

	h.acquire("w").Release() // 7+5 = 12 > 9: needs 3
	for name, want := range map[string]State{"x": StateReady, "y": StateUnloaded, "z": StateReady, "w": StateReady} {
		if got := h.state(name); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	if s := h.p.Snapshot(); s.Evictions != 1 {
		t.Fatalf("evictions = %d, want 1", s.Evictions)
	}
}

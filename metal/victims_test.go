package metal

import (
	"testing"
	"time"
)

func TestSelectVictim(t *testing.T) {
	at := func(s int) time.Time { return epoch.Add(time.Duration(s) * time.Second) }
	c := func(name string, used int, g int64) victimCandidate {
		return victimCandidate{Name: name, LastUsed: at(used), Bytes: g * gib}
	}
	for _, tc := range []struct {
		name   string
		cands  []victimCandidate
		target int64
		want   string
	}{
		{name: "none", want: ""},
		{name: "plain LRU", cands: []victimCandidate{c("new", 9, 1), c("old", 1, 1), c("mid", 5, 8)}, want: "old"},
		{name: "LRU tie: larger first", cands: []victimCandidate{c("small", 1, 1), c("big", 1, 4)}, want: "big"},
		{name: "LRU tie: then name", cands: []victimCandidate{c("y", 1, 2), c("x", 1, 2)}, want: "x"},
		{name: "target: LRU that alone frees enough", target: 3 * gib,
			cands: []victimCandidate{c("oldsmall", 1, 1), c("midbig", 5, 4), c("newbig", 9, 8)}, want: "midbig"},
		{name: "target: exactly enough counts", target: 4 * gib,
			cands: []victimCandidate{c("old", 1, 4), c("newbig", 9, 8)}, want: "old"},
		{name: "target: none frees enough, the largest", target: 10 * gib,
			cands: []victimCandidate{c("old", 1, 2), c("big", 5, 6), c("mid", 3, 4)}, want: "big"},
		{name: "target: largest tie goes to the older", target: 10 * gib,
			cands: []victimCandidate{c("newer", 5, 6), c("older", 3, 6)}, want: "older"},
		{name: "zero target is plain LRU", target: 0,
			cands: []victimCandidate{c("old", 1, 1), c("big", 2, 9)}, want: "old"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := selectVictim(tc.cands, tc.target)
			if got.Name != tc.want || ok != (tc.want != "") {
				t.Fatalf("selectVictim = %q %v, want %q", got.Name, ok, tc.want)
			}
		})
	}
}

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

	h.p.mu.Lock()
	cands := h.p.victimCandidatesLocked(h.p.entries["idle"])
	h.p.mu.Unlock()
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

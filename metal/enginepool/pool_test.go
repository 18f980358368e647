package enginepool

import (
	"net/http"
	"testing"
)

func TestRegisterValidatesSpecs(t *testing.T) {
	h := newHarness(t, Config{})
	for _, tc := range []struct {
		name string
		spec ModelSpec
	}{
		{"no name", ModelSpec{}},
		{"negative estimate", ModelSpec{Name: "x", EstimatedBytes: -1}},
		{"unknown residency", ModelSpec{Name: "x", Residency: "Sometimes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.p.Register(tc.spec); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if err := h.p.Register(ModelSpec{Name: "x"}); err != nil {
		t.Fatal(err)
	}
	if got := h.model("x").Residency; got != OnDemand {
		t.Fatalf("default residency %s, want OnDemand", got)
	}
	if err := h.p.Update(ModelSpec{Name: "unknown"}); err == nil {
		t.Fatal("updating an unknown model succeeded")
	}
}

// Registering a model again while its removal drains keeps the one entry (and its
// engine in the accounting) and applies the new spec at the next load.
func TestRegisterDuringRemovalRevivesTheEntry(t *testing.T) {
	h := newHarness(t, Config{})
	spec := h.register("a", 2, OnDemand)
	h.load("a")
	rq := h.startRequest("a", true)
	done, err := h.p.Remove("a")
	if err != nil {
		t.Fatal(err)
	}
	spec.Path = "/models/a-v2.gguf"
	if err := h.p.Register(spec); err != nil {
		t.Fatal(err)
	}
	if s := h.p.Snapshot(); s.Runners != 1 || s.CommittedBytes != 2*gib || h.state("a") != StateDraining {
		t.Fatalf("runners %d committed %d state %s", s.Runners, s.CommittedBytes, h.state("a"))
	}
	rq.end()
	eventually(t, "the unload", func() bool { return isClosed(done) })
	if got := h.state("a"); got != StateUnloaded {
		t.Fatalf("a = %s, want Unloaded and still registered", got)
	}
	h.load("a")
	if p := h.f.last(t, "a").spec.Path; p != spec.Path {
		t.Fatalf("reloaded %s", p)
	}
}

// A configured ceiling set at run time (MacNode spec.memoryCeiling) binds the next
// admission.
func TestSetConfiguredCeiling(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 6, OnDemand)
	c := h.p.SetConfiguredCeiling(4 * gib)
	if c.Bytes != 4*gib || c.Bound != BoundConfigured || h.p.Ceiling() != c {
		t.Fatalf("ceiling %+v", c)
	}
	_, err := h.p.Acquire(h.ctx(), "a")
	if status, code := statusOf(t, err); status != http.StatusInsufficientStorage || code != CodeModelTooLarge {
		t.Fatalf("got %d %s", status, code)
	}
	h.p.SetConfiguredCeiling(0) // back to the static 58 GiB of the fake 64 GiB host
	h.acquire("a").Release()
	if c := h.p.Ceiling(); c.Bound != BoundStatic || c.Bytes != 58*gib {
		t.Fatalf("ceiling %+v", c)
	}
}

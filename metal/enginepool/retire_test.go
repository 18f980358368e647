package enginepool

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Retire drains a loaded model like an admin unload — the request in flight
// finishes, new ones get the 503 of a draining model — and then keeps it unloaded: a
// request that arrives later does not load it again, even OnDemand. The unload is
// measured and kept in the entry's snapshot until Remove.
func TestRetireDrainsThenRefusesReloads(t *testing.T) {
	h := newHarness(t, Config{})
	h.register("a", 2, OnDemand)
	h.load("a")
	rq := h.startRequest("a", false)
	done, err := h.p.Retire("a")
	if err != nil {
		t.Fatal(err)
	}
	if got := h.state("a"); got != StateDraining {
		t.Fatalf("a = %s right after Retire, want Draining while its request runs", got)
	}
	assertDraining503 := func(when string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := h.p.Acquire(ctx, "a")
		var ue *UnavailableError
		if !errors.As(err, &ue) || ue.ErrCode != CodeModelDraining || ue.HTTPStatus() != 503 {
			t.Fatalf("Acquire %s: %v, want a 503 %s", when, err, CodeModelDraining)
		}
	}
	assertDraining503("while draining")
	if isClosed(done) {
		t.Fatal("Retire finished while a request was still in flight")
	}
	rq.end()
	eventually(t, "the retirement's unload", func() bool { return isClosed(done) })

	m := h.model("a")
	if m.State != StateUnloaded || !m.Retired || m.LastUnload == nil || m.LastUnload.Reason != ReasonRetired {
		t.Fatalf("after the unload: state %s retired %v lastUnload %+v, want Unloaded, retired, a report of reason %s",
			m.State, m.Retired, m.LastUnload, ReasonRetired)
	}
	assertDraining503("after the unload")
	if err := h.p.Load(h.ctx(), "a"); err == nil {
		t.Fatal("Load of a retired model succeeded")
	}
	if n := len(h.f.Runners("a")); n != 1 {
		t.Fatalf("%d runners started for a, want the first one only (no reload)", n)
	}
	if again, err := h.p.Retire("a"); err != nil || !isClosed(again) {
		t.Fatalf("Retire again: %v, want a closed channel (idempotent)", err)
	}
	removed, err := h.p.Remove("a")
	if err != nil || !isClosed(removed) {
		t.Fatalf("Remove of a retired, unloaded model: %v", err)
	}
	if _, err := h.p.Retire("a"); err == nil {
		t.Fatal("Retire of a removed model succeeded")
	}
}

package prefixindex

import (
	"fmt"
	"testing"
	"time"
)

func TestInFlightLive(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC)
	const maxAge, linger = time.Minute, 10 * time.Second
	for _, tc := range []struct {
		name string
		e    inflightEntry
		at   time.Duration // after t0
		want bool
	}{
		{"in flight, just started", inflightEntry{since: t0, requests: 1}, 0, true},
		{"in flight at its max age", inflightEntry{since: t0, requests: 2}, maxAge, true},
		{"in flight past its max age", inflightEntry{since: t0, requests: 1}, maxAge + time.Nanosecond, false},
		{"ended, within the linger", inflightEntry{since: t0, ended: t0.Add(20 * time.Second)}, 25 * time.Second, true},
		{"ended, at the linger's end", inflightEntry{since: t0, ended: t0.Add(20 * time.Second)}, 20*time.Second + linger, true},
		{"ended, past the linger", inflightEntry{since: t0, ended: t0.Add(20 * time.Second)}, 20*time.Second + linger + time.Nanosecond, false},
		{"ended, lingering but past its max age", inflightEntry{since: t0, ended: t0.Add(55 * time.Second)}, maxAge + time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := inflightLive(tc.e, t0.Add(tc.at), maxAge, linger); got != tc.want {
				t.Errorf("inflightLive = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestInFlightStartEndDeepest(t *testing.T) {
	now := time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC)
	f := NewInFlight(0, time.Minute, 10*time.Second)
	head, a1, b1 := "00000000000000a0", "00000000000000a1", "00000000000000b1"
	f.Start("r0", []string{head, a1}, now)
	if got, _ := f.Deepest("r0", []string{head, b1}, now); got != 1 {
		t.Errorf("another user of the same head on r0: depth %d, want 1", got)
	}
	if got, _ := f.Deepest("r0", []string{head, a1, "00000000000000a2"}, now); got != 2 {
		t.Errorf("the same conversation a turn further on r0: depth %d, want 2", got)
	}
	if got, _ := f.Deepest("r1", []string{head}, now); got != 0 {
		t.Errorf("r1 prefills nothing: depth %d", got)
	}

	// A second request of the head: the entry lives until both ended, then lingers.
	f.Start("r0", []string{head, b1}, now.Add(time.Second))
	f.End("r0", []string{head, a1}, now.Add(5*time.Second))
	if got, _ := f.Deepest("r0", []string{head}, now.Add(30*time.Second)); got != 1 {
		t.Errorf("the head with a request still in flight: depth %d, want 1", got)
	}
	if got, _ := f.Deepest("r0", []string{head, a1}, now.Add(16*time.Second)); got != 1 {
		t.Errorf("a1 ended 11 s ago (linger 10 s): depth %d, want 1 (the head)", got)
	}
	if _, done := f.Deepest("r0", []string{head}, now.Add(39*time.Second)); done {
		t.Error("the head is done with a request of it in flight")
	}
	f.End("r0", []string{head, b1}, now.Add(40*time.Second))
	if got, done := f.Deepest("r0", []string{head}, now.Add(50*time.Second)); got != 1 || !done {
		t.Errorf("the head ended 10 s ago: depth %d (done %v), want 1, done", got, done)
	}
	if got, _ := f.Deepest("r0", []string{head}, now.Add(51*time.Second)); got != 0 {
		t.Errorf("the head ended 11 s ago: depth %d, want 0", got)
	}
	// An End without a Start, or a second End, changes nothing.
	f.End("r1", []string{head}, now)
	f.End("r0", []string{head, b1}, now.Add(41*time.Second))
	if got, _ := f.Deepest("r0", []string{head}, now.Add(50*time.Second)); got != 1 {
		t.Errorf("after a stray End: depth %d, want 1 (its end stays at 40 s)", got)
	}
}

func TestInFlightMaxAgeAndRestart(t *testing.T) {
	now := time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC)
	f := NewInFlight(0, time.Minute, 10*time.Second)
	d := []string{"00000000000000c0"}
	f.Start("r0", d, now)
	if got, _ := f.Deepest("r0", d, now.Add(61*time.Second)); got != 0 {
		t.Errorf("a request in flight for over the max age: depth %d, want 0", got)
	}
	// A new request of the dead entry starts it again and counts both in flight:
	// the old one's End leaves the new one live.
	f.Start("r0", d, now.Add(70*time.Second))
	f.End("r0", d, now.Add(71*time.Second))
	if got, _ := f.Deepest("r0", d, now.Add(90*time.Second)); got != 1 {
		t.Errorf("restarted, one of two ended: depth %d, want 1", got)
	}
	f.End("r0", d, now.Add(91*time.Second))
	if got, _ := f.Deepest("r0", d, now.Add(102*time.Second)); got != 0 {
		t.Errorf("both ended 11 s ago: depth %d, want 0", got)
	}
}

func TestInFlightBounded(t *testing.T) {
	now := time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC)
	f := NewInFlight(4, time.Minute, 10*time.Second)
	digest := func(i int) string { return fmt.Sprintf("%016x", i) }
	for i := range 4 {
		f.Start("r0", []string{digest(i)}, now)
	}
	f.Start("r0", []string{digest(4)}, now)
	if f.Len() != 4 || deepest(f, "r0", digest(4), now) != 0 {
		t.Fatalf("full of live entries: %d kept, the fifth recorded: %v", f.Len(), deepest(f, "r0", digest(4), now) != 0)
	}
	// Two end and linger out: the next Start sweeps them and fits.
	f.End("r0", []string{digest(0)}, now)
	f.End("r0", []string{digest(1)}, now)
	later := now.Add(11 * time.Second)
	f.Start("r0", []string{digest(5)}, later)
	if f.Len() != 3 || deepest(f, "r0", digest(5), later) != 1 || deepest(f, "r0", digest(2), later) != 1 {
		t.Errorf("after the sweep: %d kept, want 3 with the new one and the live ones", f.Len())
	}
}

// deepest is f.Deepest's depth for one digest.
func deepest(f *InFlight, backend, digest string, now time.Time) int {
	d, _ := f.Deepest(backend, []string{digest}, now)
	return d
}

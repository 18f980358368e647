package fairqueue

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestShareCap: the cap a flow gets, step by step on a fake clock. Steps: "arrive A"
// at the step's time, "grant A", "done A", "forget"; each step then checks the caps
// of A and B.
func TestShareCap(t *testing.T) {
	const window = 2 * time.Second
	type step struct {
		at       time.Duration
		do       string
		capacity int
		reserve  int
		capA     int
		capB     int
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"a client alone may hold every slot", []step{
			{0, "arrive A", 4, 1, 4, 3}, // B would find A active: B's cap is one less
			{0, "grant A", 4, 1, 4, 3},
		}},
		{"a second client takes a slot from the first's cap", []step{
			{0, "arrive A", 2, 1, 2, 1},
			{0, "grant A", 2, 1, 2, 1},
			{time.Second, "arrive B", 2, 1, 1, 1},
		}},
		{"a quiet client stops counting after the window", []step{
			{0, "arrive B", 2, 1, 1, 2},
			{window - time.Millisecond, "arrive A", 2, 1, 1, 1},
			{window, "grant A", 2, 1, 2, 1}, // B's window ended; A holds one, so B is capped
			{window, "done A", 2, 1, 2, 1},  // A holds none but arrived within its window
			{2*window - 2*time.Millisecond, "", 2, 1, 2, 1},
			{2 * window, "", 2, 1, 2, 2},
		}},
		{"a client holding a slot stays active past its window", []step{
			{0, "arrive B", 3, 1, 2, 3},
			{0, "grant B", 3, 1, 2, 3},
			{time.Hour, "", 3, 1, 2, 3},
			{time.Hour, "done B", 3, 1, 3, 3},
		}},
		{"one slot: nothing to reserve", []step{
			{0, "arrive A", 1, 1, 1, 1},
			{0, "arrive B", 1, 1, 1, 1},
		}},
		{"reserve as large as the capacity still leaves one slot", []step{
			{0, "arrive A", 2, 5, 2, 1},
			{0, "arrive B", 2, 5, 1, 1},
		}},
		{"no reserve: every flow may hold all", []step{
			{0, "arrive A", 4, 0, 4, 4},
			{0, "arrive B", 4, 0, 4, 4},
		}},
		{"forget drops quiet flows only", []step{
			{0, "arrive A", 2, 1, 2, 1},
			{0, "grant B", 2, 1, 1, 1},
			{time.Hour, "forget", 2, 1, 1, 2},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s *Share
			for i, st := range c.steps {
				if s == nil {
					s = NewShare(st.reserve, window)
				}
				now := t0.Add(st.at)
				verb, flow, _ := strings.Cut(st.do, " ")
				switch verb {
				case "arrive":
					s.Arrive(flow, now)
				case "grant":
					s.Grant(flow, 1)
				case "done":
					s.Done(flow, 1)
				case "forget":
					s.Forget(now)
				case "":
				default:
					t.Fatalf("step %d: unknown step %q", i, st.do)
				}
				got := fmt.Sprint(s.Cap("A", st.capacity, now), s.Cap("B", st.capacity, now))
				if want := fmt.Sprint(st.capA, st.capB); got != want {
					t.Fatalf("step %d (%s at %v): caps A B = %s, want %s", i, st.do, st.at, got, want)
				}
			}
		})
	}
}

// TestShareKeepsASlotForANewcomer: a greedy flow that takes whatever Allows lets it
// leaves one slot of two free once another flow is active, and takes both when alone.
func TestShareKeepsASlotForANewcomer(t *testing.T) {
	s := NewShare(1, time.Second)
	take := func(flow string, now time.Time) int {
		n := 0
		for s.Allows(flow, 1, 2, now) {
			s.Grant(flow, 1)
			n++
		}
		return n
	}
	s.Arrive("heavy", t0)
	if n := take("heavy", t0); n != 2 {
		t.Fatalf("a flow alone took %d of 2 slots, want 2", n)
	}
	s.Done("heavy", 1)
	s.Done("heavy", 1)
	s.Arrive("light", t0)
	if n := take("heavy", t0); n != 1 {
		t.Fatalf("with another flow active the greedy flow took %d of 2 slots, want 1", n)
	}
	if !s.Allows("light", 1, 2, t0) {
		t.Fatal("the newcomer finds no slot it may take")
	}
	s.Done("heavy", 1)
	s.Done("heavy", 1) // more Done than Grant is harmless
	s.Done("nobody", 1)
	if got := s.Cap("light", 2, t0.Add(2*time.Second)); got != 2 {
		t.Fatalf("once the heavy flow is quiet the light flow's cap is %d, want 2", got)
	}
}

// TestShareCountsSlots: a request for n choices takes n slots of the flow's cap, so a
// flow cannot take the kept slot with wide requests; a request wider than the cap runs
// once the flow holds nothing.
func TestShareCountsSlots(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		held, width, capacity int
		otherActive           bool
		want                  bool
	}{
		{"alone, two of four held, two more fit", 2, 2, 4, false, true},
		{"alone, three held, two more do not", 3, 2, 4, false, false},
		{"another active: n=2 beside one held on three slots would take the kept one", 1, 2, 3, true, false},
		{"another active: n=2 on three slots, holding none, fits the cap of two", 0, 2, 3, true, true},
		{"another active: n=2 on four slots fits the cap of three", 1, 2, 4, true, true},
		{"another active: wider than the cap, holding nothing, runs", 0, 5, 4, true, true},
		{"another active: wider than the cap, holding one, waits", 1, 5, 4, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewShare(1, time.Minute)
			s.Arrive("A", t0)
			s.Grant("A", tc.held)
			if tc.otherActive {
				s.Arrive("B", t0)
			}
			if got := s.Allows("A", tc.width, tc.capacity, t0); got != tc.want {
				t.Errorf("Allows(A, width %d, capacity %d) holding %d = %v, want %v", tc.width, tc.capacity, tc.held, got, tc.want)
			}
			s.Done("A", tc.held)
			if !s.Allows("A", 1, tc.capacity, t0) {
				t.Error("after giving every slot back the flow may not take one")
			}
		})
	}
}

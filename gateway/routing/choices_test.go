package routing

import "testing"

// TestPickN: a request for n choices is counted as n of a replica's slots, at most
// all of them, so a replica never gets more choices to generate at once than it has
// slots, and a request wider than any replica still goes to an idle one.
func TestPickN(t *testing.T) {
	b := NewBalancer(0, nil, true)
	rt := &Route{Backends: []Backend{{Key: "ns/four", Slots: 4}}}
	steps := []struct {
		w, wantCounted int
		ok             bool
	}{{3, 3, true}, {2, 0, false}, {1, 1, true}, {1, 0, false}}
	for i, s := range steps {
		pk, ok := b.Pick(rt, nil, Hint{}, 1, s.w)
		counted := pk.Counted
		if ok != s.ok || counted != s.wantCounted {
			t.Fatalf("step %d: Pick(width %d) = %d, %v; want %d, %v", i, s.w, counted, ok, s.wantCounted, s.ok)
		}
	}
	b.Release("ns/four", 3, Hint{})
	b.Release("ns/four", 1, Hint{})
	if n := b.Outstanding("ns/four"); n != 0 {
		t.Fatalf("%d outstanding after releasing everything", n)
	}
	if pk, ok := b.Pick(rt, nil, Hint{}, 1, 10); !ok || pk.Counted != 4 {
		t.Fatalf("a 10-wide request on an idle 4-slot replica: counted %d, %v; want 4, true", pk.Counted, ok)
	}
	if _, ok := b.Pick(rt, nil, Hint{}, 1, 1); ok {
		t.Fatal("a request placed on a replica whose every slot a wide request holds")
	}
}

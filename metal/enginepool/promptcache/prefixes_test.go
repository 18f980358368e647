package promptcache

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
)

func TestHoldOf(t *testing.T) {
	where := func(tiers map[int]Tier) func(Key) Tier {
		return func(k Key) Tier {
			for i, tier := range tiers {
				if key(i) == k {
					return tier
				}
			}
			return TierNone
		}
	}
	for _, tc := range []struct {
		name     string
		backings []Backing
		tiers    map[int]Tier
		want     DigestHold
	}{
		{"no backing", nil, nil, DigestHold{}},
		{"gone", []Backing{{key(1), 100}}, nil, DigestHold{}},
		{"hot", []Backing{{key(1), 100}}, map[int]Tier{1: TierHot}, DigestHold{TierHot, 100}},
		{"ssd only", []Backing{{key(1), 100}}, map[int]Tier{1: TierSSD}, DigestHold{TierSSD, 100}},
		{"hot beats a longer ssd", []Backing{{key(1), 500}, {key(2), 100}}, map[int]Tier{1: TierSSD, 2: TierHot}, DigestHold{TierHot, 100}},
		{"longest of the best tier", []Backing{{key(1), 300}, {key(2), 100}, {key(3), 900}}, map[int]Tier{1: TierHot, 2: TierHot, 3: TierSSD}, DigestHold{TierHot, 300}},
		{"a gone one does not count", []Backing{{key(1), 900}, {key(2), 100}}, map[int]Tier{2: TierSSD}, DigestHold{TierSSD, 100}},
	} {
		if got := HoldOf(tc.backings, where(tc.tiers)); got != tc.want {
			t.Errorf("%s: HoldOf = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestHoldEvent(t *testing.T) {
	none, hot, hot2, ssd := DigestHold{}, DigestHold{TierHot, 128}, DigestHold{TierHot, 256}, DigestHold{TierSSD, 128}
	for _, tc := range []struct {
		name     string
		was, now DigestHold
		want     *runnerapi.PrefixEvent
	}{
		{"nothing to nothing", none, none, nil},
		{"unchanged", hot, hot, nil},
		{"held", none, hot, &runnerapi.PrefixEvent{Digest: "d", Tier: "hot", Tokens: 128}},
		{"more tokens", hot, hot2, &runnerapi.PrefixEvent{Digest: "d", Tier: "hot", Tokens: 256}},
		{"moves to ssd", hot, ssd, &runnerapi.PrefixEvent{Digest: "d", Tier: "ssd", Tokens: 128}},
		{"back to hot", ssd, hot, &runnerapi.PrefixEvent{Digest: "d", Tier: "hot", Tokens: 128}},
		{"dropped", ssd, none, &runnerapi.PrefixEvent{Digest: "d"}},
	} {
		ev, ok := HoldEvent("d", tc.was, tc.now)
		if ok != (tc.want != nil) || (ok && ev != *tc.want) {
			t.Errorf("%s: HoldEvent = %+v %v, want %+v", tc.name, ev, ok, tc.want)
		}
	}
}

func TestAddBacking(t *testing.T) {
	var b []Backing
	for i := range MaxBackings + 2 {
		b = AddBacking(b, Backing{key(i), i})
	}
	want := []Backing{{key(2), 2}, {key(3), 3}, {key(4), 4}, {key(5), 5}}
	if diff := cmp.Diff(want, b); diff != "" {
		t.Fatalf("bounded backings (-want +got):\n%s", diff)
	}
	before := append([]Backing(nil), b...)
	got := AddBacking(b, Backing{key(3), 30})
	want = []Backing{{key(2), 2}, {key(4), 4}, {key(5), 5}, {key(3), 30}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("re-adding a state moves it last with its tokens (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, b); diff != "" {
		t.Errorf("AddBacking changed its argument (-want +got):\n%s", diff)
	}
}

func TestAnswerPrefixes(t *testing.T) {
	ev := func(d, tier string) runnerapi.PrefixEvent {
		if tier == "" {
			return runnerapi.PrefixEvent{Digest: d}
		}
		return runnerapi.PrefixEvent{Digest: d, Tier: tier, Tokens: 64}
	}
	// The log kept events 3..6 (1 and 2 fell out).
	log := []LoggedEvent{{3, ev("a", "hot")}, {4, ev("b", "hot")}, {5, ev("a", "ssd")}, {6, ev("c", "hot")}}
	held := []runnerapi.PrefixEvent{ev("a", "ssd"), ev("b", "hot"), ev("c", "hot")}
	for _, tc := range []struct {
		name      string
		log       []LoggedEvent
		seq       uint64
		epoch     string
		after     uint64
		wantReset bool
		want      []runnerapi.PrefixEvent
	}{
		{"another epoch", log, 6, "old", 6, true, held},
		{"first call", log, 6, "", 0, true, held},
		{"too far behind", log, 6, "e1", 1, true, held},
		{"just in the log", log, 6, "e1", 2, false, []runnerapi.PrefixEvent{ev("b", "hot"), ev("a", "ssd"), ev("c", "hot")}},
		{"coalesced to the latest per digest", log, 6, "e1", 3, false, []runnerapi.PrefixEvent{ev("b", "hot"), ev("a", "ssd"), ev("c", "hot")}},
		{"the newest", log, 6, "e1", 5, false, []runnerapi.PrefixEvent{ev("c", "hot")}},
		{"up to date", log, 6, "e1", 6, false, []runnerapi.PrefixEvent{}},
		{"ahead of the runner", log, 6, "e1", 9, true, held},
		{"empty log, up to date", nil, 0, "e1", 0, false, []runnerapi.PrefixEvent{}},
		{"empty log, after a restart of the log", nil, 0, "e1", 4, true, held},
	} {
		got := AnswerPrefixes("e1", tc.seq, tc.log, held, tc.epoch, tc.after)
		want := runnerapi.PrefixEvents{Epoch: "e1", Seq: tc.seq, Reset: tc.wantReset, Events: tc.want}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestPrefixTable: associations, refreshes and evictions log exactly the changes.
func TestPrefixTable(t *testing.T) {
	tiers := map[Key]Tier{}
	where := func(k Key) Tier { return tiers[k] }
	tab := NewPrefixTable("e1")
	since := uint64(0)
	next := func(what string, want ...runnerapi.PrefixEvent) {
		t.Helper()
		got, _ := tab.Answer("e1", since)
		if got.Reset {
			t.Fatalf("%s: unexpected reset %+v", what, got)
		}
		if want == nil {
			want = []runnerapi.PrefixEvent{}
		}
		if diff := cmp.Diff(want, got.Events); diff != "" {
			t.Errorf("%s (-want +got):\n%s", what, diff)
		}
		since = got.Seq
	}
	tab.Associate([]string{"d1", "d2"}, Backing{key(1), 256})
	next("associated, not refreshed")
	tiers[key(1)] = TierHot
	tab.Refresh(where)
	next("saved hot", runnerapi.PrefixEvent{Digest: "d1", Tier: "hot", Tokens: 256}, runnerapi.PrefixEvent{Digest: "d2", Tier: "hot", Tokens: 256})
	tab.Refresh(where)
	next("nothing changed")
	tab.Associate([]string{"d2"}, Backing{key(2), 512})
	tiers[key(2)], tiers[key(1)] = TierSSD, TierSSD
	tab.Refresh(where)
	next("evicted from hot", runnerapi.PrefixEvent{Digest: "d1", Tier: "ssd", Tokens: 256}, runnerapi.PrefixEvent{Digest: "d2", Tier: "ssd", Tokens: 512})
	delete(tiers, key(1))
	tab.Refresh(where)
	next("d1's only state gone", runnerapi.PrefixEvent{Digest: "d1"})
	full, _ := tab.Answer("", 0)
	if diff := cmp.Diff([]runnerapi.PrefixEvent{{Digest: "d2", Tier: "ssd", Tokens: 512}}, full.Events); !full.Reset || diff != "" {
		t.Errorf("full listing (reset %v) (-want +got):\n%s", full.Reset, diff)
	}
	// A dropped state is forgotten: coming back it is not a backing any more.
	tiers[key(1)] = TierHot
	tab.Refresh(where)
	next("a forgotten state is no backing")

	// Beyond the bound the least recently associated digests are dropped (d2 first),
	// and the log is bounded: a caller that far behind starts over.
	for i := range MaxPrefixDigests {
		tab.Associate([]string{fmt.Sprintf("x%05d", i)}, Backing{key(3), 64})
	}
	tiers[key(3)] = TierHot
	tab.Refresh(where)
	got, _ := tab.Answer("e1", since)
	if !got.Reset || len(got.Events) != MaxPrefixDigests || got.Events[0].Digest != "x00000" {
		t.Fatalf("a caller behind the bounded log: reset %v with %d events (first %+v), want a listing of %d x digests",
			got.Reset, len(got.Events), got.Events[0], MaxPrefixDigests)
	}
	if behind := got.Seq - since; behind <= PrefixLogLength {
		t.Fatalf("only %d events logged: the reset was not the log's bound", behind)
	}
	tab.Associate([]string{"y"}, Backing{key(3), 64})
	got, _ = tab.Answer("e1", got.Seq)
	if diff := cmp.Diff([]runnerapi.PrefixEvent{{Digest: "x00000"}}, got.Events); diff != "" {
		t.Errorf("the least recently associated digest is dropped (-want +got):\n%s", diff)
	}
}

func TestPrefixTableWakesWaiters(t *testing.T) {
	tab := NewPrefixTable("e1")
	_, wait := tab.Answer("e1", 0)
	select {
	case <-wait:
		t.Fatal("woken before any event")
	default:
	}
	tab.Associate([]string{"d"}, Backing{key(1), 64})
	tab.Refresh(func(Key) Tier { return TierHot })
	<-wait // an event wakes the waiter
	_, wait = tab.Answer("e1", 1)
	tab.Close()
	<-wait // and so does Close
	if _, wait = tab.Answer("e1", 1); wait == nil {
		t.Fatal("no channel after Close")
	}
	<-wait // later waiters return at once
}

func TestParseDigests(t *testing.T) {
	d := func(i int) string { return fmt.Sprintf("%016x", i) }
	many := make([]string, runnerapi.MaxPrefixDigests+3)
	for i := range many {
		many[i] = d(i)
	}
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"none", "", nil},
		{"one", d(1), []string{d(1)}},
		{"several", d(1) + "," + d(2) + "," + d(3), []string{d(1), d(2), d(3)}},
		{"the deepest are kept", strings.Join(many, ","), many[3:]},
		{"upper case", "00000000000000AB", nil},
		{"too short", d(1) + ",abc", nil},
		{"too long", d(1) + "0", nil},
		{"spaces", d(1) + ", " + d(2), nil},
		{"empty item", d(1) + ",", nil},
		{"not hex", "000000000000000g", nil},
	} {
		if diff := cmp.Diff(tc.want, ParseDigests(tc.in)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestPrefixTableBytesPerToken: answers carry the latest saved state's bytes per
// token, resets and events alike, none before a save; an empty state is no figure.
func TestPrefixTableBytesPerToken(t *testing.T) {
	tab := NewPrefixTable("e1")
	if got, _ := tab.Answer("", 0); got.BytesPerToken != 0 {
		t.Errorf("before any save: %v bytes a token, want 0", got.BytesPerToken)
	}
	tab.NoteStateSize(1<<20, 4096)
	tab.NoteStateSize(0, 10)
	tab.NoteStateSize(10, 0)
	if got, _ := tab.Answer("", 0); !got.Reset || got.BytesPerToken != 256 {
		t.Errorf("a reset after a save of 1 MiB for 4096 tokens: %+v, want 256 bytes a token", got)
	}
	tab.NoteStateSize(3<<20, 4096)
	if got, _ := tab.Answer("e1", 0); got.Reset || got.BytesPerToken != 768 {
		t.Errorf("events after a second save: %+v, want its 768 bytes a token", got)
	}
}

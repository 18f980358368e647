package ledger

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/budget"
	"github.com/macfleet/macfleet/gateway/metering"
)

func allow(budget.Own) budget.Decision { return budget.Decision{Allowed: true} }

// TestLedgerRecords follows one namespace through a day's end: the records taken,
// what a restarted replica reads back, and requests in flight across the day.
func TestLedgerRecords(t *testing.T) {
	at := time.Date(2026, 11, 25, 23, 59, 50, 0, time.UTC)
	clk := clocktesting.NewFakeClock(at)
	l := New("gw-a", clk)
	_, done := l.Admit("team-a", "ci", 40, allow)
	l.Record("team-a", "ci", "team-a/qwen", metering.Usage{Input: 10, Cached: 3, Output: 5})
	l.Record("team-a", "app", "team-a/qwen", metering.Usage{Input: 1, Output: 1})
	l.Record("team-a", "ci", "team-a/qwen", metering.Usage{Input: 2, Output: 2})
	got := l.Take()
	minute, hour := metav1.NewTime(at.Truncate(time.Minute)), metav1.NewTime(at.Truncate(time.Hour))
	rt := metav1.NewMicroTime(at)
	want := []*mfv1.TokenUsage{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "gw-a.2026-11-25"},
		Spec: mfv1.TokenUsageSpec{Gateway: "gw-a", Day: "2026-11-25", RenewTime: &rt,
			Usage: []mfv1.KeyUsage{
				{Key: "app", Deployment: "team-a/qwen", Requests: 1, InputTokens: 1, OutputTokens: 1},
				{Key: "ci", Deployment: "team-a/qwen", Requests: 2, InputTokens: 12, CachedTokens: 3, OutputTokens: 7},
			},
			Windows: []mfv1.KeyWindow{
				{Key: "app", Minute: &minute, MinuteTokens: 2, Hour: &hour, HourTokens: 2},
				{Key: "ci", Minute: &minute, MinuteTokens: 19, Hour: &hour, HourTokens: 19, InFlight: 1, ReservedTokens: 40},
			}},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("the first record (-want +got):\n%s", diff)
	}
	if got := l.Take(); len(got) != 0 {
		t.Errorf("nothing changed, yet %d records were taken", len(got))
	}
	clk.Step(RenewEvery)
	if got := l.Take(); len(got) != 1 {
		t.Errorf("a request in flight for %v: %d records taken, want it renewed", RenewEvery, len(got))
	}

	// A restarted replica reads its record back and counts on.
	r := New("gw-a", clk)
	r.Restore(want[0])
	r.Restore(want[0]) // once only
	var own budget.Own
	r.Admit("team-a", "ci", 1, func(o budget.Own) budget.Decision { own = o; return budget.Decision{Allowed: false} })
	if own.Key.DayTokens != 19 || own.Namespace.DayTokens != 21 || own.Key.MinuteTokens != 19 || own.Namespace.MinuteTokens != 21 {
		t.Errorf("restored counts: %+v, want 19 and 21 tokens of the day and minute", own)
	}

	// The day ends with a request in flight: the new day's record counts from zero
	// but for the request in flight and its reservation, which then end.
	clk.Step(10 * time.Second)
	if got := l.Take(); len(got) != 1 || got[0].Name != "gw-a.2026-11-26" || len(got[0].Spec.Windows) != 1 ||
		got[0].Spec.Windows[0].ReservedTokens != 40 || got[0].Spec.Windows[0].InFlight != 1 {
		t.Fatalf("at the day's end: %d records, want the new day's with the request in flight and its reservation", len(got))
	}
	l.Record("team-a", "ci", "team-a/qwen", metering.Usage{Input: 1, Output: 1})
	done()
	done() // once only
	got = l.Take()
	if len(got) != 1 || got[0].Name != "gw-a.2026-11-26" {
		t.Fatalf("after the day's end: %d records, want the new day's", len(got))
	}
	if u := got[0].Spec.Usage; len(u) != 1 || u[0].InputTokens != 1 {
		t.Errorf("the new day's usage: %+v", u)
	}
	if w := got[0].Spec.Windows; len(w) != 1 || w[0].InFlight != 0 || w[0].ReservedTokens != 0 || w[0].MinuteTokens != 2 {
		t.Errorf("the new day's windows: %+v", w)
	}
}

// TestLedgerAdmitConcurrency: two requests arriving together cannot both take the last
// concurrent slot, because Admit decides and counts under one lock.
func TestLedgerAdmitConcurrency(t *testing.T) {
	l := New("gw-a", clocktesting.NewFakeClock(time.Now()))
	limit := func(o budget.Own) budget.Decision { return budget.Decision{Allowed: o.Namespace.InFlight < 5} }
	admitted := make(chan bool, 50)
	for range 50 {
		go func() {
			d, _ := l.Admit("team-a", "ci", 1, limit)
			admitted <- d.Allowed
		}()
	}
	n := 0
	for range 50 {
		if <-admitted {
			n++
		}
	}
	if n != 5 {
		t.Errorf("%d of 50 requests admitted under a limit of 5 in flight", n)
	}
}

// TestLedgerReservations: concurrent requests reserve their asks under one lock, so
// no more than the window's limit is ever reserved, and each release gives its ask
// back: after every request ends, the whole limit is free again.
func TestLedgerReservations(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 25, 10, 30, 0, 0, time.UTC))
	l := New("gw-a", clk)
	tb := []mfv1.TokenBudget{{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "min"},
		Spec: mfv1.TokenBudgetSpec{TokensPerMinute: ptr.To[int64](200)}}}
	decide := func(o budget.Own) budget.Decision { return budget.Decide(tb, "ci", 60, o, nil, clk.Now()) }
	dones := make(chan func(), 50)
	for range 50 {
		go func() {
			_, done := l.Admit("team-a", "ci", 60, decide)
			dones <- done
		}()
	}
	var admitted []func()
	for range 50 {
		if d := <-dones; d != nil {
			admitted = append(admitted, d)
		}
	}
	if len(admitted) != 3 {
		t.Errorf("%d of 50 requests of 60 tokens admitted under 200 a minute, want 3", len(admitted))
	}
	for _, done := range admitted {
		done()
	}
	var own budget.Own
	if d, _ := l.Admit("team-a", "ci", 200, func(o budget.Own) budget.Decision {
		own = o
		return budget.Decide(tb, "ci", 200, o, nil, clk.Now())
	}); !d.Allowed || own.Namespace.Reserved != 0 || own.Key.Reserved != 0 {
		t.Errorf("after every request ended: %+v with %+v, want the whole minute free", d, own)
	}
}

// TestAttackUsageReportWrapsTheDay: reports whose sum passes int64 (two of 2^62 input
// and output tokens each, as a Mac could forge before the gateway bounded them, or a
// record read back after a restart) and another replica's record of the same size
// must saturate, never wrap negative: every count of the record stays at the
// ledger's maximum (2^53 - 1, what the TokenUsage schema accepts) and the namespace's
// budget still refuses its next request.
func TestAttackUsageReportWrapsTheDay(t *testing.T) {
	const most = 1<<53 - 1 // metering.MaxCount
	at := time.Date(2026, 11, 25, 10, 30, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(at)
	huge := metering.Usage{Input: 1 << 62, Cached: 1 << 62, Output: 1 << 62}
	l := New("gw-a", clk)
	l.Record("team-a", "ci", "team-a/qwen", huge)
	l.Record("team-a", "ci", "team-a/qwen", huge)
	got := l.Take()
	if len(got) != 1 {
		t.Fatalf("%d records taken, want 1", len(got))
	}
	// A restarted replica reads the record back and counts on.
	r := New("gw-a", clk)
	r.Restore(got[0])
	r.Record("team-a", "ci", "team-a/qwen", huge)
	restored := r.Take()
	if len(restored) != 1 {
		t.Fatalf("%d records taken after the restart, want 1", len(restored))
	}

	tb := []mfv1.TokenBudget{{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "day"},
		Spec: mfv1.TokenBudgetSpec{TokensPerDay: ptr.To[int64](1_000_000)}}}
	for _, tc := range []struct {
		name string
		l    *Ledger
		rec  *mfv1.TokenUsage
	}{{"the replica", l, got[0]}, {"the restarted replica", r, restored[0]}} {
		t.Run(tc.name, func(t *testing.T) {
			var own budget.Own
			d, _ := tc.l.Admit("team-a", "ci", 1, func(o budget.Own) budget.Decision {
				own = o
				return budget.Decide(tb, "ci", 1, o, nil, clk.Now())
			})
			for _, n := range []int64{own.Key.MinuteTokens, own.Key.HourTokens, own.Key.DayTokens,
				own.Namespace.MinuteTokens, own.Namespace.HourTokens, own.Namespace.DayTokens} {
				if n != most {
					t.Errorf("counts %+v, want every window at %d", own, int64(most))
					break
				}
			}
			if d.Allowed {
				t.Errorf("the budget admitted the next request: %+v", d)
			}
			u, w := tc.rec.Spec.Usage[0], tc.rec.Spec.Windows[0]
			if u.InputTokens != most || u.CachedTokens != most || u.OutputTokens != most || w.MinuteTokens != most || w.HourTokens != most {
				t.Errorf("the record: %+v %+v, want every count at %d", u, w, int64(most))
			}
		})
	}

	// Another replica's record at the maximum, twice over in one record: its sum
	// saturates too, and the budget refuses on it alone.
	peer := got[0].DeepCopy()
	peer.Spec.Gateway = "gw-b"
	peer.Spec.Usage = append(peer.Spec.Usage, mfv1.KeyUsage{Key: "app", Deployment: "team-a/qwen",
		InputTokens: 1 << 62, OutputTokens: 1 << 62})
	p := budget.PeerFrom(peer)
	if p.Total.DayTokens != most || p.Total.MinuteTokens != most {
		t.Errorf("the peer's namespace: %+v, want its day and minute at %d", p.Total, int64(most))
	}
	if d := budget.Decide(tb, "ci", 1, budget.Own{}, []budget.Peer{p, p}, clk.Now()); d.Allowed {
		t.Errorf("two peers at the maximum: the budget admitted a request")
	}
}

// TestLedgerBeat: the beat namespace's record is taken at once, even empty, then
// every RenewEvery while nothing changes; another namespace without requests in
// flight is not renewed, and "" renews none.
func TestLedgerBeat(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC))
	l := New("gw-a", clk)
	l.Record("team-b", "ci", "team-b/qwen", metering.Usage{Input: 1})
	l.SetBeat("team-a")
	names := func() []string {
		var out []string
		for _, tu := range l.Take() {
			out = append(out, tu.Namespace+"/"+tu.Name)
		}
		return out
	}
	for _, step := range []struct {
		after time.Duration
		beat  string
		want  []string
	}{
		{0, "team-a", []string{"team-a/gw-a.2026-11-25", "team-b/gw-a.2026-11-25"}},
		{RenewEvery - time.Millisecond, "team-a", nil},
		{time.Millisecond, "team-a", []string{"team-a/gw-a.2026-11-25"}},
		{RenewEvery, "", nil},
	} {
		clk.Step(step.after)
		l.SetBeat(step.beat)
		got := names()
		slices.Sort(got)
		if diff := cmp.Diff(step.want, got); diff != "" {
			t.Errorf("at +%v with beat %q, records taken (-want +got):\n%s", clk.Since(time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)), step.beat, diff)
		}
	}
}

// TestLedgerClosing: a namespace whose record was refused as being deleted gets no
// record for ClosingWait, its counts kept; the beat moves to the next namespace
// SetBeat named, and back once the wait is over.
func TestLedgerClosing(t *testing.T) {
	start := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	l := New("gw-a", clk)
	l.SetBeat("team-a", "team-b")
	l.Record("team-a", "ci", "team-a/qwen", metering.Usage{Input: 1})
	taken := func() map[string]int64 {
		out := map[string]int64{}
		for _, tu := range l.Take() {
			n := out[tu.Namespace] // a record with no usage (the beat's) is taken too
			for _, u := range tu.Spec.Usage {
				n += u.InputTokens
			}
			out[tu.Namespace] = n
		}
		return out
	}
	if diff := cmp.Diff(map[string]int64{"team-a": 1}, taken()); diff != "" {
		t.Errorf("before: records taken (-want +got):\n%s", diff)
	}
	l.Closing("team-a")
	l.Record("team-a", "ci", "team-a/qwen", metering.Usage{Input: 2})
	if diff := cmp.Diff(map[string]int64{"team-b": 0}, taken()); diff != "" {
		t.Errorf("team-a closing: records taken (-want +got):\n%s", diff)
	}
	clk.Step(ClosingWait)
	if diff := cmp.Diff(map[string]int64{"team-a": 3}, taken()); diff != "" {
		t.Errorf("after the wait: records taken (-want +got):\n%s", diff)
	}
}

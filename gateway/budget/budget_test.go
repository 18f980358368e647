package budget

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/metering"
)

func tb(name, key string, perMin, perHour, perDay *int64, conc *int32) mfv1.TokenBudget {
	return mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name},
		Spec: mfv1.TokenBudgetSpec{Key: key, TokensPerMinute: perMin, TokensPerHour: perHour, TokensPerDay: perDay,
			ConcurrentRequests: conc}}
}

func TestDecide(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 25, 10, 30, 15, 500e6, time.UTC))
	now := clk.Now()
	minute, hour, day := Start(Minute, now), Start(Hour, now), Start(Day, now)
	lastMinute := minute.Add(-time.Minute)
	tally := func(m, h, d int64, inflight int64) Tally {
		return Tally{Minute: minute, MinuteTokens: m, Hour: hour, HourTokens: h, Day: day, DayTokens: d, InFlight: inflight}
	}
	peer := func(renewed time.Time, keys map[string]Tally) Peer {
		p := Peer{Gateway: "gw-b", Renewed: renewed, Keys: keys}
		for _, k := range keys {
			p.Total.Minute, p.Total.Hour, p.Total.Day = k.Minute, k.Hour, k.Day
			p.Total.MinuteTokens += k.MinuteTokens
			p.Total.HourTokens += k.HourTokens
			p.Total.DayTokens += k.DayTokens
			p.Total.InFlight += k.InFlight
			p.Total.Reserved += k.Reserved
		}
		return p
	}
	for _, tc := range []struct {
		name    string
		budgets []mfv1.TokenBudget
		key     string
		own     Own
		peers   []Peer
		// ask is the request's (1 when unset: the check of a budget before asks).
		ask  int64
		want Decision
	}{
		{name: "no budgets", key: "ci", own: Own{Key: tally(1e9, 1e9, 1e9, 100)}, want: Decision{Allowed: true}},
		{name: "below the minute", key: "ci", budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](100), nil, nil, nil)},
			own: Own{Key: tally(99, 99, 99, 0), Namespace: tally(99, 99, 99, 0)}, want: Decision{Allowed: true}},
		{name: "the minute is full", key: "ci", budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](100), nil, nil, nil)},
			own:  Own{Key: tally(100, 100, 100, 0), Namespace: tally(100, 100, 100, 0)},
			want: Decision{Budget: "team-a/b", Window: Minute, Limit: 100, Used: 100, Ask: 1, Reset: minute.Add(time.Minute)}},
		{name: "last minute's tokens count nothing", key: "ci", budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](100), nil, nil, nil)},
			own:  Own{Namespace: Tally{Minute: lastMinute, MinuteTokens: 500}},
			want: Decision{Allowed: true}},
		{name: "the namespace's sum over keys and replicas", key: "ci",
			budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](100), nil, nil, nil)},
			own:     Own{Key: tally(10, 10, 10, 0), Namespace: tally(60, 60, 60, 0)},
			peers:   []Peer{peer(now, map[string]Tally{"app": tally(40, 40, 40, 0)})},
			want:    Decision{Budget: "team-a/b", Window: Minute, Limit: 100, Used: 100, Ask: 1, Reset: minute.Add(time.Minute)}},
		{name: "a key's budget counts that key alone", key: "ci",
			budgets: []mfv1.TokenBudget{tb("ci-budget", "ci", ptr.To[int64](100), nil, nil, nil)},
			own:     Own{Key: tally(10, 10, 10, 0), Namespace: tally(60, 60, 60, 0)},
			peers:   []Peer{peer(now, map[string]Tally{"app": tally(400, 400, 400, 0), "ci": tally(89, 89, 89, 0)})},
			want:    Decision{Allowed: true}},
		{name: "a key's budget across replicas", key: "ci",
			budgets: []mfv1.TokenBudget{tb("ci-budget", "ci", ptr.To[int64](100), nil, nil, nil)},
			own:     Own{Key: tally(10, 10, 10, 0)},
			peers:   []Peer{peer(now, map[string]Tally{"ci": tally(90, 90, 90, 0)})},
			want:    Decision{Budget: "team-a/ci-budget", Window: Minute, Limit: 100, Used: 100, Ask: 1, Reset: minute.Add(time.Minute)}},
		{name: "another key's budget does not apply", key: "ci",
			budgets: []mfv1.TokenBudget{tb("app-budget", "app", ptr.To[int64](1), nil, nil, nil)},
			own:     Own{Key: tally(10, 10, 10, 0), Namespace: tally(10, 10, 10, 0)}, want: Decision{Allowed: true}},
		{name: "the day is full: it resets at midnight", key: "ci",
			budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](1000), ptr.To[int64](1000), ptr.To[int64](500), nil)},
			own:     Own{Namespace: tally(5, 300, 500, 0)},
			want:    Decision{Budget: "team-a/b", Window: Day, Limit: 500, Used: 500, Ask: 1, Reset: day.AddDate(0, 0, 1)}},
		{name: "of two full windows the later reset is named", key: "ci",
			budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](10), ptr.To[int64](20), nil, nil)},
			own:     Own{Namespace: tally(10, 20, 20, 0)},
			want:    Decision{Budget: "team-a/b", Window: Hour, Limit: 20, Used: 20, Ask: 1, Reset: hour.Add(time.Hour)}},
		{name: "of two budgets the later reset is named", key: "ci",
			budgets: []mfv1.TokenBudget{tb("ns", "", ptr.To[int64](10), nil, nil, nil), tb("ci", "ci", nil, ptr.To[int64](10), nil, nil)},
			own:     Own{Key: tally(10, 10, 10, 0), Namespace: tally(10, 10, 10, 0)},
			want:    Decision{Budget: "team-a/ci", Window: Hour, Limit: 10, Used: 10, Ask: 1, Reset: hour.Add(time.Hour)}},
		{name: "a zero budget refuses everything", key: "ci",
			budgets: []mfv1.TokenBudget{tb("off", "", nil, nil, ptr.To[int64](0), nil)},
			want:    Decision{Budget: "team-a/off", Window: Day, Limit: 0, Used: 0, Ask: 1, Reset: day.AddDate(0, 0, 1)}},
		{name: "concurrency: own plus peers' in flight", key: "ci",
			budgets: []mfv1.TokenBudget{tb("c", "", nil, nil, nil, ptr.To[int32](3))},
			own:     Own{Namespace: tally(0, 0, 0, 1)},
			peers:   []Peer{peer(now.Add(-time.Second), map[string]Tally{"app": tally(0, 0, 0, 2)})},
			want:    Decision{Budget: "team-a/c", Window: Concurrent, Limit: 3, Used: 3, Reset: now.Add(ConcurrentRetry)}},
		{name: "concurrency: a stale peer's in flight is not counted", key: "ci",
			budgets: []mfv1.TokenBudget{tb("c", "", nil, nil, nil, ptr.To[int32](3))},
			own:     Own{Namespace: tally(0, 0, 0, 1)},
			peers:   []Peer{peer(now.Add(-StaleAfter-time.Second), map[string]Tally{"app": tally(0, 0, 0, 2)})},
			want:    Decision{Allowed: true}},
		{name: "a stale peer's tokens of the current minute still count", key: "ci",
			budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](100), nil, nil, nil)},
			peers:   []Peer{peer(now.Add(-StaleAfter-time.Second), map[string]Tally{"app": tally(100, 100, 100, 0)})},
			want:    Decision{Budget: "team-a/b", Window: Minute, Limit: 100, Used: 100, Ask: 1, Reset: minute.Add(time.Minute)}},
		{name: "the ask fits what is left", key: "ci", budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](200), nil, nil, nil)},
			own: Own{Namespace: tally(50, 50, 50, 0)}, ask: 150, want: Decision{Allowed: true}},
		{name: "the ask is over what is left: wait for the minute", key: "ci",
			budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](200), nil, nil, nil)},
			own:     Own{Namespace: tally(51, 51, 51, 0)}, ask: 150,
			want: Decision{Budget: "team-a/b", Window: Minute, Limit: 200, Used: 51, Ask: 150, Reset: minute.Add(time.Minute)}},
		{name: "reservations of requests in flight fill the minute: retry when they end", key: "ci",
			budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](200), nil, nil, nil)},
			own:     Own{Namespace: withReserved(tally(0, 0, 0, 1), 150)}, ask: 150,
			want: Decision{Budget: "team-a/b", Window: Minute, Limit: 200, Reserved: 150, Ask: 150, Reset: now.Add(ConcurrentRetry)}},
		{name: "reservations count in every window, whatever minute they started in", key: "ci",
			budgets: []mfv1.TokenBudget{tb("b", "", nil, ptr.To[int64](1000), nil, nil)},
			own:     Own{Namespace: withReserved(Tally{Minute: lastMinute, MinuteTokens: 10, InFlight: 3}, 900)}, ask: 101,
			want: Decision{Budget: "team-a/b", Window: Hour, Limit: 1000, Reserved: 900, Ask: 101, Reset: now.Add(ConcurrentRetry)}},
		{name: "a fresh peer's reservations count", key: "ci",
			budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](200), nil, nil, nil)},
			peers:   []Peer{peer(now, map[string]Tally{"app": withReserved(tally(0, 0, 0, 1), 100)})}, ask: 101,
			want: Decision{Budget: "team-a/b", Window: Minute, Limit: 200, Reserved: 100, Ask: 101, Reset: now.Add(ConcurrentRetry)}},
		{name: "a stale peer's reservations ended with it", key: "ci",
			budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](200), nil, nil, nil)},
			peers:   []Peer{peer(now.Add(-StaleAfter-time.Second), map[string]Tally{"app": withReserved(tally(0, 0, 0, 1), 100)})}, ask: 200,
			want: Decision{Allowed: true}},
		{name: "an ask over the whole limit runs in an empty window", key: "ci",
			budgets: []mfv1.TokenBudget{tb("min", "", ptr.To[int64](200), nil, nil, nil)},
			own:     Own{Namespace: tally(0, 0, 1000, 0)}, ask: 5000, want: Decision{Allowed: true}},
		{name: "an ask over the whole limit waits for the requests in flight", key: "ci",
			budgets: []mfv1.TokenBudget{tb("min", "", ptr.To[int64](200), nil, nil, nil)},
			own:     Own{Namespace: withReserved(tally(0, 0, 0, 1), 1)}, ask: 5000,
			want: Decision{Budget: "team-a/min", Window: Minute, Limit: 200, Reserved: 1, Ask: 5000, Reset: now.Add(ConcurrentRetry)}},
		{name: "an ask over the whole limit waits for the next window once a token was used", key: "ci",
			budgets: []mfv1.TokenBudget{tb("min", "", ptr.To[int64](200), nil, nil, nil)},
			own:     Own{Namespace: tally(1, 1, 1, 0)}, ask: 5000,
			want: Decision{Budget: "team-a/min", Window: Minute, Limit: 200, Used: 1, Ask: 5000, Reset: minute.Add(time.Minute)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.budgets, tc.key, tc.ask, tc.own, tc.peers, now)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

func withReserved(t Tally, n int64) Tally {
	t.Reserved = n
	return t
}

func TestEstimate(t *testing.T) {
	slot := int64(1024 + metering.SlotRounding)
	for _, tc := range []struct {
		name  string
		lim   metering.Limits
		bytes int
		want  Request
	}{
		{"a prompt's estimate plus max_tokens × n", metering.Limits{Context: 1024, Sequences: 4, MaxTokens: 120, Generates: true}, 100,
			Request{Prompt: 51, Choices: 4, Output: 120}},
		{"without max_tokens, the context per choice", metering.Limits{Context: 1024, Sequences: 2, Generates: true}, 100,
			Request{Prompt: 51, Choices: 2, Output: slot}},
		{"a max_tokens over the context is the context", metering.Limits{Context: 1024, Sequences: 1, MaxTokens: 1 << 30, Generates: true}, 0,
			Request{Prompt: 1, Choices: 1, Output: slot}},
		{"the prompt's estimate is at most what its sequences hold", metering.Limits{Context: 1024, Sequences: 1, MaxTokens: 1, Generates: true}, 1 << 20,
			Request{Prompt: slot, Choices: 1, Output: 1}},
		{"embeddings generate nothing", metering.Limits{Context: 1024, Sequences: 3}, 40, Request{Prompt: 21}},
		{"count_tokens runs no sequence", metering.Limits{}, 500, Request{}},
	} {
		if got := Estimate(tc.lim, tc.bytes); got != tc.want {
			t.Errorf("%s: Estimate = %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got, want := Estimate(metering.Limits{Context: 1024, Sequences: 4, MaxTokens: 120, Generates: true}, 100).Tokens(), int64(51+480); got != want {
		t.Errorf("Tokens = %d, want %d", got, want)
	}
}

// TestFit: a request over the room left is capped to (room − prompt) / n a choice,
// the least cap of every window and budget; one whose prompt and a token a choice do
// not fit waits for the requests in flight or the window; over a whole limit it runs
// alone in an empty window with a token a choice.
func TestFit(t *testing.T) {
	now := time.Date(2026, 11, 25, 10, 30, 15, 500e6, time.UTC)
	minute, hour := Start(Minute, now), Start(Hour, now)
	own := func(used, reserved int64) Own {
		t := Tally{Minute: minute, MinuteTokens: used, Hour: hour, HourTokens: used, Reserved: reserved, InFlight: min(reserved, 1)}
		return Own{Key: t, Namespace: t}
	}
	perMin := []mfv1.TokenBudget{tb("b", "", ptr.To[int64](200), nil, nil, nil)}
	n16 := Request{Prompt: 40, Choices: 16, Output: 1536} // n: 16 without max_tokens: 24,616
	for _, tc := range []struct {
		name    string
		budgets []mfv1.TokenBudget
		own     Own
		req     Request
		want    Decision
	}{
		{name: "within the room: as asked", budgets: perMin, own: own(50, 50), req: Request{Prompt: 40, Choices: 2, Output: 30},
			want: Decision{Allowed: true}},
		{name: "n: 16 without max_tokens in an empty minute: capped to the limit", budgets: perMin, req: n16,
			want: Decision{Allowed: true, Cap: 10, Ask: 200}},
		{name: "capped to what the used and reserved leave", budgets: perMin, own: own(60, 40), req: n16,
			want: Decision{Allowed: true, Cap: 3, Ask: 88}},
		{name: "a token a choice is all that is left", budgets: perMin, own: own(100, 44), req: n16,
			want: Decision{Allowed: true, Cap: 1, Ask: 56}},
		{name: "not a token a choice left, requests in flight: retry when they end", budgets: perMin, own: own(100, 45), req: n16,
			want: Decision{Budget: "team-a/b", Window: Minute, Limit: 200, Used: 100, Reserved: 45, Ask: 56, Reset: now.Add(ConcurrentRetry)}},
		{name: "not a token a choice left once they end: the next minute", budgets: perMin, own: own(150, 0), req: n16,
			want: Decision{Budget: "team-a/b", Window: Minute, Limit: 200, Used: 150, Ask: 56, Reset: minute.Add(time.Minute)}},
		{name: "a prompt over the whole limit runs alone with a token a choice", budgets: perMin,
			req: Request{Prompt: 300, Choices: 2, Output: 8}, want: Decision{Allowed: true, Cap: 1, Ask: 302}},
		{name: "a prompt over the whole limit waits for an empty window", budgets: perMin, own: own(0, 10),
			req:  Request{Prompt: 300, Choices: 2, Output: 8},
			want: Decision{Budget: "team-a/b", Window: Minute, Limit: 200, Reserved: 10, Ask: 302, Reset: now.Add(ConcurrentRetry)}},
		{name: "the least cap of every window and budget", own: own(0, 0), req: n16,
			budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](1000), ptr.To[int64](120), nil, nil), tb("k", "ci", ptr.To[int64](400), nil, nil, nil)},
			want:    Decision{Allowed: true, Cap: 5, Ask: 120}},
		{name: "a refusal wins over a cap", own: own(0, 0), req: n16,
			budgets: []mfv1.TokenBudget{tb("b", "", ptr.To[int64](1000), nil, nil, nil), tb("k", "ci", nil, nil, ptr.To[int64](0), nil)},
			want:    Decision{Budget: "team-a/k", Window: Day, Ask: 56, Reset: Start(Day, now).AddDate(0, 0, 1)}},
		{name: "an output the gateway cannot cap is refused over the room", budgets: perMin, own: own(100, 0), req: Request{Prompt: 150},
			want: Decision{Budget: "team-a/b", Window: Minute, Limit: 200, Used: 100, Ask: 150, Reset: minute.Add(time.Minute)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Fit(tc.budgets, "ci", tc.req, tc.own, nil, now)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Fit (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 25, 10, 30, 15, 500e6, time.UTC)
	for _, tc := range []struct {
		reset time.Time
		want  time.Duration
	}{
		{Start(Minute, now).Add(time.Minute), 45 * time.Second}, // 44.5 s, rounded up
		{now.Add(time.Millisecond), time.Second},
		{now, time.Second},
		{now.Add(-time.Second), time.Second},
		{Start(Day, now).AddDate(0, 0, 1), 13*time.Hour + 29*time.Minute + 45*time.Second},
	} {
		if got := (Decision{Reset: tc.reset}).RetryAfter(now); got != tc.want {
			t.Errorf("RetryAfter with reset %v: %v, want %v", tc.reset, got, tc.want)
		}
	}
}

func TestTallyAddMovesWindows(t *testing.T) {
	at := time.Date(2026, 11, 25, 23, 59, 59, 0, time.UTC)
	var tl Tally
	tl.Add(at, 10)
	tl.Add(at.Add(500*time.Millisecond), 5)
	tl.Add(at.Add(2*time.Second), 7) // a new minute, hour and day
	want := Tally{Minute: Start(Minute, at.Add(2*time.Second)), MinuteTokens: 7, Hour: Start(Hour, at.Add(2*time.Second)),
		HourTokens: 7, Day: Start(Day, at.Add(2*time.Second)), DayTokens: 7}
	if diff := cmp.Diff(want, tl); diff != "" {
		t.Errorf("after a day's end (-want +got):\n%s", diff)
	}
}

func TestPeerFrom(t *testing.T) {
	m := metav1.NewTime(time.Date(2026, 11, 25, 10, 30, 0, 0, time.UTC))
	old := metav1.NewTime(m.Add(-time.Minute))
	h := metav1.NewTime(time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC))
	rt := metav1.NewMicroTime(m.Add(20 * time.Second))
	tu := &mfv1.TokenUsage{Spec: mfv1.TokenUsageSpec{Gateway: "gw-b", Day: "2026-11-25", RenewTime: &rt,
		Usage: []mfv1.KeyUsage{
			{Key: "ci", Deployment: "team-a/qwen", Requests: 2, InputTokens: 10, CachedTokens: 4, OutputTokens: 5},
			{Key: "ci", Deployment: "team-a/llama", Requests: 1, InputTokens: 1, OutputTokens: 2},
			{Key: "app", Deployment: "team-a/qwen", Requests: 1, InputTokens: 100, OutputTokens: 50},
		},
		Windows: []mfv1.KeyWindow{
			{Key: "app", Minute: &old, MinuteTokens: 150, Hour: &h, HourTokens: 150},
			{Key: "ci", Minute: &m, MinuteTokens: 18, Hour: &h, HourTokens: 18, InFlight: 2, ReservedTokens: 300},
		}}}
	day := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	want := Peer{Gateway: "gw-b", Renewed: rt.Time,
		Keys: map[string]Tally{
			"ci":  {Minute: m.Time, MinuteTokens: 18, Hour: h.Time, HourTokens: 18, Day: day, DayTokens: 18, InFlight: 2, Reserved: 300},
			"app": {Minute: old.Time, MinuteTokens: 150, Hour: h.Time, HourTokens: 150, Day: day, DayTokens: 150},
		},
		// app's minute is over: the namespace's current one holds ci's alone.
		Total: Tally{Minute: m.Time, MinuteTokens: 18, Hour: h.Time, HourTokens: 168, Day: day, DayTokens: 168, InFlight: 2, Reserved: 300},
	}
	if diff := cmp.Diff(want, PeerFrom(tu)); diff != "" {
		t.Errorf("PeerFrom (-want +got):\n%s", diff)
	}
}

package autoscaler

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// measured builds a history the way the controller does: one sample of each load,
// every step on the fake clock, the clock ending at the last sample's time plus
// after.
func measured(clk *clocktesting.FakeClock, step, after time.Duration, loads ...int32) []Sample {
	var h []Sample
	for i, l := range loads {
		if i > 0 {
			clk.Step(step)
		}
		h = append(h, Sample{Time: clk.Now(), InFlight: l})
	}
	clk.Step(after)
	return h
}

// repeat is n times load.
func repeat(n int, load int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = load
	}
	return out
}

func cat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestRecommend(t *testing.T) {
	// Samples every 10s; up after 30s of sustained load, down after 2m of low load.
	base := Policy{Min: 1, Max: 5, Target: 2, StabilizationWindow: 30 * time.Second, ScaleDownDelay: 2 * time.Minute,
		StaleAfter: 15 * time.Second}
	with := func(f func(*Policy)) Policy { p := base; f(&p); return p }
	const step = 10 * time.Second
	cases := []struct {
		name    string
		policy  Policy
		loads   []int32
		held    int32 // held requests in the last sample
		after   time.Duration
		current int32
		want    int32
		reason  string
		msg     string // a substring of the message
	}{
		{name: "no measurement", policy: base, current: 2, want: 2, reason: v1alpha1.ReasonLoadUnknown,
			msg: "no load measurement yet; keeping 2 replicas"},
		{name: "stale measurement", policy: base, loads: repeat(10, 9), after: 20 * time.Second, current: 2, want: 2,
			reason: v1alpha1.ReasonLoadUnknown, msg: "no load measurement since 2026-11-22T12:01:30Z; keeping 2 replicas"},
		{name: "stale measurement above max", policy: base, after: time.Hour, current: 9, want: 5,
			reason: v1alpha1.ReasonLoadUnknown, msg: "replicas brought from 9 within minReplicas..maxReplicas (1..5)"},
		{name: "a spike waits for the window", policy: base, loads: cat(repeat(5, 1), []int32{8}), current: 1, want: 1,
			reason: v1alpha1.ReasonScaleUpStabilizing,
			msg:    "the load has needed more than 1 replicas since 2026-11-22T12:00:50Z with no break over 15s; scaling up once it has for a whole stabilizationWindow (30s)"},
		{name: "sustained load scales up", policy: base, loads: cat(repeat(3, 1), repeat(4, 8)), current: 1, want: 4,
			reason: v1alpha1.ReasonScaledUp, msg: "scaled up from 1 to 4: at least 8 requests in flight for 30s, target 2 per replica"},
		{name: "the lowest load of the window decides", policy: base, loads: []int32{1, 8, 6, 9, 7}, current: 1, want: 3,
			reason: v1alpha1.ReasonScaledUp, msg: "at least 6 requests in flight"},
		{name: "the window's opening sample counts", policy: base, loads: []int32{1, 8, 8, 8}, after: 5 * time.Second,
			current: 1, want: 1, reason: v1alpha1.ReasonScaleUpStabilizing},
		{name: "scale up stops at max", policy: base, loads: repeat(4, 30), current: 2, want: 5, reason: v1alpha1.ReasonScaledUp,
			msg: "scaled up from 2 to 5: at least 30 requests in flight for 30s, target 2 per replica; the load needs 15, maxReplicas is 5"},
		{name: "at max", policy: base, loads: repeat(20, 30), current: 5, want: 5, reason: v1alpha1.ReasonAtMaxReplicas,
			msg: "the load needs more than maxReplicas (5 replicas at target 2 requests in flight each)"},
		{name: "no window scales on the first sample", policy: with(func(p *Policy) { p.StabilizationWindow = 0 }),
			loads: []int32{7}, current: 1, want: 4, reason: v1alpha1.ReasonScaledUp, msg: "for 0s"},
		{name: "after a restart the window is observed first", policy: base, loads: repeat(3, 8), current: 1, want: 1,
			reason: v1alpha1.ReasonScaleUpStabilizing},
		{name: "low load waits for the delay", policy: base, loads: cat(repeat(20, 8), repeat(7, 2)), current: 4, want: 4,
			reason: v1alpha1.ReasonScaleDownDelayed,
			msg:    "the load has fitted fewer than 4 replicas since 2026-11-22T12:03:20Z with no break over 15s; scaling down once it has for a whole scaleDownDelay (2m0s)"},
		{name: "low load for the whole delay scales down", policy: base, loads: cat(repeat(5, 8), repeat(13, 2)), current: 4, want: 1,
			reason: v1alpha1.ReasonScaledDown, msg: "scaled down from 4 to 1: at most 2 requests in flight for 2m0s, target 2 per replica"},
		{name: "the highest load of the delay decides", policy: base, loads: cat(repeat(5, 8), []int32{2, 2, 5, 2, 1, 2, 2, 2, 2, 1, 2, 2, 2}),
			current: 4, want: 3, reason: v1alpha1.ReasonScaledDown, msg: "at most 5 requests in flight"},
		{name: "after a restart the delay is observed first", policy: base, loads: repeat(6, 0), current: 4, want: 4,
			reason: v1alpha1.ReasonScaleDownDelayed},
		{name: "min is kept", policy: with(func(p *Policy) { p.Min = 2 }), loads: repeat(20, 0), current: 4, want: 2,
			reason: v1alpha1.ReasonScaledDown, msg: "scaled down from 4 to 2"},
		{name: "at min", policy: with(func(p *Policy) { p.Min = 2 }), loads: repeat(20, 0), current: 2, want: 2,
			reason: v1alpha1.ReasonWithinTarget, msg: "2 replicas, the minimum"},
		{name: "zero after a whole delay without a request", policy: with(func(p *Policy) { p.Min = 0 }),
			loads: repeat(13, 0), current: 1, want: 0, reason: v1alpha1.ReasonScaledDown, msg: "scaled down from 1 to 0"},
		{name: "one request in the delay keeps a replica", policy: with(func(p *Policy) { p.Min = 0 }),
			loads: cat(repeat(3, 0), []int32{1}, repeat(9, 0)), current: 1, want: 1, reason: v1alpha1.ReasonScaleDownDelayed,
			msg: "since 2026-11-22T12:00:40Z with no break over 15s"},
		{name: "never below one while a request is in flight", policy: with(func(p *Policy) { p.Min = 0; p.ScaleDownDelay = 0 }),
			loads: []int32{1}, current: 1, want: 1, reason: v1alpha1.ReasonWithinTarget},
		{name: "held requests wake a deployment at zero at once", policy: with(func(p *Policy) { p.Min = 0 }),
			loads: []int32{0}, held: 3, current: 0, want: 1, reason: v1alpha1.ReasonScaledUp,
			msg: "scaled up from 0 to 1: 3 requests arrived with no replica"},
		{name: "one held request (a gateway's wake) wakes a deployment at zero at once", policy: with(func(p *Policy) { p.Min = 0 }),
			loads: repeat(4, 0), held: 1, current: 0, want: 1, reason: v1alpha1.ReasonScaledUp,
			msg: "scaled up from 0 to 1: a request arrived with no replica"},
		{name: "a burst of held requests wakes one replica at once", policy: with(func(p *Policy) { p.Min = 0 }),
			loads: repeat(4, 0), held: 6, current: 0, want: 1, reason: v1alpha1.ReasonScaledUp},
		{name: "zero at zero", policy: with(func(p *Policy) { p.Min = 0 }), loads: repeat(20, 0), current: 0, want: 0,
			reason: v1alpha1.ReasonWithinTarget, msg: "0 replicas: no request in flight (minReplicas is 0)"},
		{name: "below min", policy: with(func(p *Policy) { p.Min = 2 }), loads: repeat(20, 0), current: 0, want: 2,
			reason: v1alpha1.ReasonOutsideLimits, msg: "scaled up from 0 to 2: spec.replicas was below minReplicas (2)"},
		{name: "above max", policy: base, loads: repeat(20, 1), current: 9, want: 5,
			reason: v1alpha1.ReasonOutsideLimits, msg: "scaled down from 9 to 5: spec.replicas was above maxReplicas"},
		{name: "within target", policy: base, loads: repeat(20, 4), current: 2, want: 2, reason: v1alpha1.ReasonWithinTarget,
			msg: "2 replicas for the load at target 2 requests in flight each"},
		{name: "load between targets holds", policy: base, loads: repeat(20, 3), current: 2, want: 2, reason: v1alpha1.ReasonWithinTarget},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			h := measured(clk, step, tc.after, tc.loads...)
			if tc.held > 0 {
				h[len(h)-1].Held = tc.held
			}
			got := Recommend(h, tc.policy, tc.current, clk.Now())
			if got.Replicas != tc.want || got.Reason != tc.reason || !strings.Contains(got.Message, tc.msg) {
				t.Errorf("Recommend = %d %s %q\nwant %d %s with %q", got.Replicas, got.Reason, got.Message, tc.want, tc.reason, tc.msg)
			}
			if got.Known() != (tc.reason != v1alpha1.ReasonLoadUnknown) {
				t.Errorf("Known() = %v for reason %s", got.Known(), got.Reason)
			}
		})
	}
}

// TestRecommendMessageIsStable proves an episode keeps one decision and message over
// the measurements it lasts — a steady fall, and loads hovering at a replica boundary
// on either side — so that the status is not rewritten on every measurement; and that
// a break longer than StaleAfter starts a new episode.
func TestRecommendMessageIsStable(t *testing.T) {
	p := Policy{Min: 1, Max: 5, Target: 2, StabilizationWindow: 30 * time.Second, ScaleDownDelay: 2 * time.Minute, StaleAfter: 15 * time.Second}
	for _, tc := range []struct {
		name    string
		history []int32 // before the first recommendation
		next    []int32 // each adds a sample 5s later; the recommendation must not change
		current int32
		reason  string
	}{
		{name: "falling", history: cat(repeat(20, 8), []int32{2}), next: []int32{1, 3, 0, 2, 3}, current: 4,
			reason: v1alpha1.ReasonScaleDownDelayed},
		{name: "hovering above", history: []int32{4, 4, 5}, next: []int32{4, 5, 4, 4, 5, 4, 5, 4, 4, 5}, current: 2,
			reason: v1alpha1.ReasonScaleUpStabilizing},
		{name: "hovering below", history: []int32{3, 3, 2}, next: []int32{3, 2, 3, 3, 2, 3, 2, 2, 3, 2, 3, 3, 2}, current: 2,
			reason: v1alpha1.ReasonScaleDownDelayed},
		{name: "hovering at max", history: []int32{10, 11}, next: []int32{10, 11, 10, 10, 11}, current: 5,
			reason: v1alpha1.ReasonAtMaxReplicas},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			h := measured(clk, 5*time.Second, 0, tc.history...)
			first := Recommend(h, p, tc.current, clk.Now())
			if first.Reason != tc.reason || first.Replicas != tc.current {
				t.Fatalf("Recommend = %+v, want %d replicas, %s", first, tc.current, tc.reason)
			}
			for i, l := range tc.next {
				clk.Step(5 * time.Second)
				h = append(h, Sample{Time: clk.Now(), InFlight: l})
				if got := Recommend(h, p, tc.current, clk.Now()); got != first {
					t.Fatalf("after load %d (sample %d): %+v, want the episode's %+v", l, i, got, first)
				}
			}
		})
	}

	// A break of 20s (> StaleAfter) ends the episode; the next one names its own start.
	clk := clocktesting.NewFakeClock(t0)
	h := measured(clk, 5*time.Second, 0, 2, 5, 4, 4, 4, 4, 5)
	got := Recommend(h, p, 2, clk.Now())
	if want := "since 2026-11-22T12:00:30Z with no break over 15s"; got.Reason != v1alpha1.ReasonScaleUpStabilizing || !strings.Contains(got.Message, want) {
		t.Errorf("after a 20s break: %+v, want ScaleUpStabilizing %q", got, want)
	}
	// An episode older than the history says for over how long, and keeps saying it.
	p.ScaleDownDelay = time.Minute
	var hover []int32
	for i := range 40 {
		hover = append(hover, 4+int32(i%2)) // needs 2, then 3: the window's lowest fits 2
	}
	h = Prune(measured(clk, 5*time.Second, 0, hover...), p, clk.Now())
	got = Recommend(h, p, 2, clk.Now())
	if want := "needed more than 2 replicas for over 1m0s with no break over 15s"; !strings.Contains(got.Message, want) {
		t.Errorf("an episode beyond the history: %q, want %q", got.Message, want)
	}
	clk.Step(5 * time.Second)
	h = Prune(append(h, Sample{Time: clk.Now(), InFlight: 5}), p, clk.Now())
	if again := Recommend(h, p, 2, clk.Now()); again != got {
		t.Errorf("the next measurement: %+v, want the episode's %+v", again, got)
	}
}

// TestRecommendIgnoresFutureSamples: a sample stamped after now (a clock step back)
// is not taken as the latest.
func TestRecommendIgnoresFutureSamples(t *testing.T) {
	p := Policy{Min: 1, Max: 5, Target: 1, StaleAfter: time.Minute}
	h := []Sample{{Time: t0, InFlight: 2}, {Time: t0.Add(time.Hour), InFlight: 5}}
	if got := Recommend(h, p, 1, t0); got.Replicas != 2 {
		t.Errorf("Recommend = %+v, want 2 replicas from the sample at now", got)
	}
}

func TestPolicyFor(t *testing.T) {
	md := &v1alpha1.ModelDeployment{}
	if _, ok := PolicyFor(md, time.Minute); ok {
		t.Errorf("PolicyFor without spec.autoscaling: ok")
	}
	md.Spec.Engine.Parallel = 4
	md.Spec.Autoscaling = &v1alpha1.AutoscalingSpec{MaxReplicas: 3}
	got, _ := PolicyFor(md, time.Minute)
	want := Policy{Min: 1, Max: 3, Target: 4, ScaleDownDelay: DefaultScaleDownDelay, StabilizationWindow: DefaultStabilizationWindow, StaleAfter: time.Minute}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	md.Spec.Autoscaling = &v1alpha1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 2, TargetInFlight: ptr.To[int32](6),
		ScaleDownDelay: &metav1.Duration{Duration: time.Minute}, StabilizationWindow: &metav1.Duration{}}
	got, _ = PolicyFor(md, time.Minute)
	want = Policy{Min: 0, Max: 2, Target: 6, ScaleDownDelay: time.Minute, StaleAfter: time.Minute}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("explicit (-want +got):\n%s", diff)
	}
}

func TestPrune(t *testing.T) {
	p := Policy{StabilizationWindow: 30 * time.Second, ScaleDownDelay: time.Minute}
	clk := clocktesting.NewFakeClock(t0)
	h := measured(clk, 10*time.Second, 5*time.Second, repeat(12, 1)...) // 12:00:00 … 12:01:50, now 12:01:55
	got := Prune(h, p, clk.Now())
	// The delay's window opens at 12:00:55: the sample of 12:00:50 is in effect then.
	if len(got) != 7 || !got[0].Time.Equal(t0.Add(50*time.Second)) {
		t.Errorf("Prune kept %d samples from %s, want 7 from 12:00:50", len(got), got[0].Time)
	}
	if short := Prune(h[:3], p, t0.Add(30*time.Second)); len(short) != 3 {
		t.Errorf("Prune of a history shorter than the window kept %d of 3", len(short))
	}
}

func TestMeasureEvery(t *testing.T) {
	for _, tc := range []struct{ interval, window, want time.Duration }{
		{5 * time.Second, 30 * time.Second, 5 * time.Second},
		{5 * time.Second, 10 * time.Second, 2 * time.Second},
		{5 * time.Second, 2 * time.Second, time.Second},
		{5 * time.Second, 0, 5 * time.Second},
		{50 * time.Millisecond, 5 * time.Second, 50 * time.Millisecond},
		{500 * time.Millisecond, 1 * time.Second, 500 * time.Millisecond},
	} {
		if got := measureEvery(tc.interval, tc.window); got != tc.want {
			t.Errorf("measureEvery(%v, %v) = %v, want %v", tc.interval, tc.window, got, tc.want)
		}
	}
}

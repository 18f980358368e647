package addressproof

import (
	"errors"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestDecide(t *testing.T) {
	p := Policy{TTL: 5 * time.Minute, MinBackoff: time.Second, MaxBackoff: 8 * time.Second}
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t0 := clk.Now()
	clk.SetTime(t0.Add(90 * time.Second))
	now := clk.Now()
	bad := errors.New("the server is macfleet://node/mac-b, not macfleet://node/mac-a")
	const addr = "10.0.0.5:8080"
	for _, tc := range []struct {
		name       string
		last       *Result
		readySince time.Time
		want       Verdict
		why        string // a substring of want.Why
	}{
		{name: "never probed", last: nil, want: Verdict{Probe: true}, why: "not verified yet"},
		{name: "proven, fresh", last: &Result{Address: addr, At: t0},
			want: Verdict{Proven: true, RecheckAfter: 210 * time.Second}},
		{name: "proven an instant ago", last: &Result{Address: addr, At: now},
			want: Verdict{Proven: true, RecheckAfter: 5 * time.Minute}},
		{name: "proof expired", last: &Result{Address: addr, At: now.Add(-5 * time.Minute)},
			want: Verdict{Probe: true}, why: "expired"},
		{name: "proven at another address", last: &Result{Address: "10.0.0.9:8080", At: t0},
			want: Verdict{Probe: true}, why: "not verified yet"},
		{name: "proof from the future (clock stepped back)", last: &Result{Address: addr, At: now.Add(time.Minute)},
			want: Verdict{Probe: true}, why: "expired"},
		{name: "failed once, within backoff", last: &Result{Address: addr, At: now.Add(-500 * time.Millisecond), Err: bad, Failures: 1},
			want: Verdict{RecheckAfter: 500 * time.Millisecond}, why: "failed verification (1 times): the server is macfleet://node/mac-b"},
		{name: "failed once, backoff over", last: &Result{Address: addr, At: now.Add(-time.Second), Err: bad, Failures: 1},
			want: Verdict{Probe: true}, why: "failed verification"},
		{name: "failed three times: 4s backoff", last: &Result{Address: addr, At: now.Add(-3 * time.Second), Err: bad, Failures: 3},
			want: Verdict{RecheckAfter: time.Second}, why: "(3 times)"},
		{name: "failed many times: capped backoff", last: &Result{Address: addr, At: now.Add(-7 * time.Second), Err: bad, Failures: 40},
			want: Verdict{RecheckAfter: time.Second}, why: "(40 times)"},
		{name: "failed before the Mac became Ready: probed at once", last: &Result{Address: addr, At: now.Add(-3 * time.Second), Err: bad, Failures: 3},
			readySince: now.Add(-2 * time.Second), want: Verdict{Probe: true}, why: "(3 times)"},
		{name: "failed after the Mac became Ready: backoff", last: &Result{Address: addr, At: now.Add(-3 * time.Second), Err: bad, Failures: 3},
			readySince: now.Add(-4 * time.Second), want: Verdict{RecheckAfter: time.Second}, why: "(3 times)"},
		{name: "proven: Ready since does not matter", last: &Result{Address: addr, At: t0},
			readySince: now, want: Verdict{Proven: true, RecheckAfter: 210 * time.Second}},
		{name: "failed at another address: the new one is probed", last: &Result{Address: "10.0.0.9:8080", At: now, Err: bad, Failures: 5},
			want: Verdict{Probe: true}, why: "not verified yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(p, tc.last, addr, tc.readySince, now)
			if !strings.Contains(got.Why, tc.why) || (tc.why == "") != (got.Why == "") {
				t.Errorf("Why = %q, want it to contain %q", got.Why, tc.why)
			}
			got.Why = ""
			if got != tc.want {
				t.Errorf("Decide = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	p := Policy{MinBackoff: time.Second, MaxBackoff: 10 * time.Second}
	for failures, want := range []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second} {
		if got := Backoff(p, failures); got != want {
			t.Errorf("Backoff(%d) = %v, want %v", failures, got, want)
		}
	}
}

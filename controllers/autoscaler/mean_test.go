package autoscaler

import (
	"testing"
	"time"

	"k8s.io/utils/ptr"
)

func TestMeanLeases(t *testing.T) {
	loaded := t0.Add(-time.Hour)
	at := func(d time.Duration, seconds float64) leaseReading {
		return leaseReading{at: t0.Add(d), loadedAt: loaded, seconds: seconds}
	}
	for _, tc := range []struct {
		name      string
		prev, cur leaseReading
		want      float64
		wantOK    bool
	}{
		{"two reads 2 s apart, 15 lease-seconds between", at(0, 10), at(2*time.Second, 25), 7.5, true},
		{"no lease between", at(0, 10), at(5*time.Second, 10), 0, true},
		{"no previous read", leaseReading{}, at(2*time.Second, 25), 0, false},
		{"the agent has no integral now", at(0, 10), leaseReading{}, 0, false},
		{"the same instant", at(time.Second, 10), at(time.Second, 12), 0, false},
		{"the agent's clock went back", at(2*time.Second, 10), at(time.Second, 12), 0, false},
		{"the integral shrank", at(0, 10), at(time.Second, 4), 0, false},
		{"another engine (reloaded)", at(0, 10), leaseReading{at: t0.Add(time.Second), loadedAt: t0, seconds: 11}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := meanLeases(tc.prev, tc.cur)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("meanLeases = %v, %v; want %v, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestQueueHeld(t *testing.T) {
	report := func(gw string, s int, queued int32, area *float64) gatewayQueue {
		return gatewayQueue{Gateway: gw, Queued: queued, QueuedSeconds: area, At: t0.Add(time.Duration(s) * time.Second)}
	}
	before := report("g", 0, 1, ptr.To(100.0))
	before.held = 3.25 // what it stood for at the previous read
	prev := []gatewayQueue{report("other", 0, 0, ptr.To(0.0)), before}
	for _, tc := range []struct {
		name string
		prev []gatewayQueue
		q    gatewayQueue
		want float64
	}{
		{"a later report: the mean in between", prev, report("g", 4, 0, ptr.To(130.0)), 7.5},
		{"the same report again: what it stood for", prev, report("g", 0, 1, ptr.To(100.0)), 3.25},
		{"no report of that gateway before: the count", prev[:1], report("g", 4, 9, ptr.To(130.0)), 9},
		{"no read before: the count", nil, report("g", 4, 9, ptr.To(130.0)), 9},
		{"a gateway without the integral: the count", prev, report("g", 4, 2, nil), 2},
		{"the previous report had none: the count", []gatewayQueue{report("g", 0, 1, nil)}, report("g", 4, 2, ptr.To(5.0)), 2},
		{"an older report: the count", prev, report("g", -1, 6, ptr.To(90.0)), 6},
		{"the integral shrank: the count", prev, report("g", 4, 1, ptr.To(50.0)), 1},
		{"same time, another integral: the count", prev, report("g", 0, 4, ptr.To(101.0)), 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := queueHeld(tc.prev, tc.q); got != tc.want {
				t.Errorf("queueHeld = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLoadOf(t *testing.T) {
	for _, tc := range []struct {
		inFlight, held float64
		want           Load
	}{
		{0, 0, Load{}},
		{0.01, 0, Load{InFlight: 1}},              // a request in the interval is a request
		{2, 0, Load{InFlight: 2}},                 // a whole mean stays
		{2 + 1e-9, 0, Load{InFlight: 2}},          // float error is not a request
		{1.5, 0.2, Load{InFlight: 2}},             // the sum rounded up: 2
		{1.5, 0.7, Load{InFlight: 2, Held: 1}},    // 2.2: 3
		{7.5, 11.25, Load{InFlight: 8, Held: 11}}, // 18.75: 19
		{0, 3, Load{Held: 3}},
	} {
		if got := loadOf(tc.inFlight, tc.held); got != tc.want {
			t.Errorf("loadOf(%v, %v) = %+v, want %+v", tc.inFlight, tc.held, got, tc.want)
		}
	}
}

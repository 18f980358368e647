package chart

import (
	"slices"
	"testing"
)

// TestGatewayDrainsOnRollout: the gateway pod keeps serving through a preStop pause
// while its endpoints are withdrawn, then drains for --drain-timeout, and its grace
// period covers both with a margin, so that the kubelet never kills a stream the
// gateway still lets finish; readiness is probed so that the drain's failing /readyz
// takes it out.
func TestGatewayDrainsOnRollout(t *testing.T) {
	tests := []struct {
		name      string
		set       []string
		preStop   int64 // 0: no preStop hook
		drainFlag string
		grace     int64
	}{
		{name: "defaults", preStop: 5, drainFlag: "--drain-timeout=600s", grace: 620},
		{name: "long generations", set: []string{"gateway.drain.timeoutSeconds=3600", "gateway.drain.preStopSeconds=10"},
			preStop: 10, drainFlag: "--drain-timeout=3600s", grace: 3625},
		{name: "no pause", set: []string{"gateway.drain.preStopSeconds=0"}, drainFlag: "--drain-timeout=600s", grace: 615},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := findDeployment(t, render(t, tc.set...), "macfleet-gateway").Spec.Template.Spec
			if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds != tc.grace {
				t.Errorf("terminationGracePeriodSeconds %v, want %d", pod.TerminationGracePeriodSeconds, tc.grace)
			}
			c := pod.Containers[0]
			if !slices.Contains(c.Args, tc.drainFlag) {
				t.Errorf("args %q lack %s", c.Args, tc.drainFlag)
			}
			var got int64
			if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
				got = c.Lifecycle.PreStop.Sleep.Seconds
			}
			if got != tc.preStop || (tc.preStop == 0 && c.Lifecycle != nil) {
				t.Errorf("preStop %+v, want a sleep of %d seconds", c.Lifecycle, tc.preStop)
			}
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("readiness probe %+v, want GET /readyz", c.ReadinessProbe)
			}
		})
	}
}

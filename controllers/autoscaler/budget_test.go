package autoscaler

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAutoscalerWriteBudget measures the API writes an autoscaled deployment costs at
// the production pace — a measurement every DefaultInterval (5s) of the fake clock,
// with the default stabilizationWindow (30s) and scaleDownDelay (5m) — under three
// load profiles, and holds them to the budget docs/autoscaling.md states:
//
//   - steady load: 0 writes a minute;
//   - a step up and back down: 3 writes (spec patch, status patch, the next
//     measurement's status patch) and 1 Event per scale, and 1 status patch per
//     episode that does not scale yet;
//   - load hovering at a replica boundary, needing one more replica every other
//     measurement: one episode, so one status patch when it begins (and one more
//     should it outlast the longest window), not one per measurement.
//
// Writes are spec and status patches (macfleet_autoscaler_api_writes_total) plus
// Events (one per scale, listed from the API server). The figures are logged.
func TestAutoscalerWriteBudget(t *testing.T) {
	f := start(t)
	const perMinute = int(time.Minute / DefaultInterval)
	for _, tc := range []struct {
		name    string
		minutes int
		load    func(tick int) int32 // requests in flight at the tick-th measurement
		// wantScales is the scales the profile makes; maxWrites bounds the spec and
		// status patches of the whole profile, maxBusiestMinute those of any minute;
		// every minute after the quietAfter-th writes nothing (0: not checked).
		wantScales       int
		maxWrites        int
		maxBusiestMinute int
		quietAfter       int
	}{
		{name: "steady", minutes: 10, load: func(int) int32 { return 2 },
			wantScales: 0, maxWrites: 2, maxBusiestMinute: 2, quietAfter: 1},
		{name: "step", minutes: 12, load: func(tick int) int32 {
			switch {
			case tick < 2*perMinute:
				return 2 // 1 replica at target 2
			case tick < 5*perMinute:
				return 7 // needs 4
			default:
				return 1 // fits 1
			}
		}, wantScales: 2, maxWrites: 2 + 2*3 + 2, maxBusiestMinute: 4},
		{name: "boundary", minutes: 5, load: func(tick int) int32 {
			return 4 + int32(tick%2) // 2 replicas, then 3 every other measurement
		}, wantScales: 1, maxWrites: 2 + 1 + 3 + 1, maxBusiestMinute: 7, quietAfter: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ff := *f
			ff.t = t
			name := "budget-" + tc.name
			ff.create(autoscaled(name, v1alpha1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: 4,
				TargetInFlight: ptr.To[int32](2)}))
			label := ff.ns + "/" + name
			var perMin []int
			last := 0
			for tick := range tc.minutes * perMinute {
				ff.tick(name, DefaultInterval, Load{InFlight: tc.load(tick)})
				if (tick+1)%perMinute == 0 {
					w := int(writes(&ff, name))
					perMin = append(perMin, w-last)
					last = w
				}
			}
			total := int(writes(&ff, name))
			scaled := int(testutil.ToFloat64(scales.WithLabelValues(label, "up")) + testutil.ToFloat64(scales.WithLabelValues(label, "down")))
			events := ff.countEvents(name, scaled)
			busiest := 0
			for _, w := range perMin {
				busiest = max(busiest, w)
			}
			t.Logf("%s: %d spec+status writes and %d Events over %d minutes (%.1f writes a minute, busiest minute %d); writes by minute %v",
				tc.name, total, events, tc.minutes, float64(total+events)/float64(tc.minutes), busiest, perMin)
			if scaled != tc.wantScales {
				t.Errorf("%d scales, want %d", scaled, tc.wantScales)
			}
			if total > tc.maxWrites {
				t.Errorf("%d spec and status writes, want at most %d", total, tc.maxWrites)
			}
			if busiest > tc.maxBusiestMinute {
				t.Errorf("the busiest minute wrote %d times, want at most %d", busiest, tc.maxBusiestMinute)
			}
			for i := tc.quietAfter; tc.quietAfter > 0 && i < len(perMin); i++ {
				if perMin[i] != 0 {
					t.Errorf("minute %d wrote %d times, want 0 once the load settled", i+1, perMin[i])
				}
			}
			if err := ff.e.Client.Delete(t.Context(), ff.get(name)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// countEvents waits until the API server holds want Events about the deployment and
// returns how many it holds (counting a series' repetitions).
func (f *fixture) countEvents(name string, want int) int {
	f.t.Helper()
	n := 0
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		var list eventsv1.EventList
		if err := f.e.Client.List(f.t.Context(), &list, client.InNamespace(f.ns)); err != nil {
			return false, err.Error()
		}
		n = 0
		for _, ev := range list.Items {
			if ev.Regarding.Name != name {
				continue
			}
			n++
			if ev.Series != nil {
				n += int(ev.Series.Count) - 1
			}
		}
		return n == want, fmt.Sprintf("%d Events about %s, want %d", n, name, want)
	})
	return n
}

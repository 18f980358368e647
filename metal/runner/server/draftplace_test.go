//go:build cgo && !race

package server

import (
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/metal/runner/netdevice"
)

// TestPlaceDraft: where a draft computes for each --draft-device, beside a model on
// the CPU and on an accelerator, before and after its steps are timed.
func TestPlaceDraft(t *testing.T) {
	ms := time.Millisecond
	timed := func(cpu, accel time.Duration) draftTimes { return draftTimes{CPU: cpu, Accel: accel} }
	for _, tc := range []struct {
		name    string
		choice  netdevice.DeviceChoice
		accel   bool
		times   draftTimes
		want    draftPlan
		whyHas  string
		wantErr string
	}{
		{name: "auto, model on the CPU", choice: netdevice.DeviceAuto, want: draftPlan{OnCPU: true}, whyHas: "model is on the CPU"},
		{name: "auto, model on a GPU, not timed yet", choice: netdevice.DeviceAuto, accel: true, want: draftPlan{Measure: true}},
		{name: "auto, only one device timed", choice: netdevice.DeviceAuto, accel: true, times: timed(0, ms), want: draftPlan{Measure: true}},
		{name: "auto, the CPU's step shorter", choice: netdevice.DeviceAuto, accel: true, times: timed(100*time.Microsecond, 450*time.Microsecond),
			want: draftPlan{OnCPU: true}, whyHas: "measured: a step took 100µs on the CPU, 450µs on the accelerator"},
		{name: "auto, the accelerator's step shorter", choice: netdevice.DeviceAuto, accel: true, times: timed(3*ms, ms),
			want: draftPlan{}, whyHas: "measured: a step took 1ms on the accelerator, 3ms on the CPU"},
		{name: "auto, equal steps stay with the model", choice: netdevice.DeviceAuto, accel: true, times: timed(ms, ms), want: draftPlan{}},
		{name: "cpu asked beside a GPU", choice: netdevice.DeviceCPU, accel: true, want: draftPlan{OnCPU: true}, whyHas: "--draft-device cpu"},
		{name: "cpu asked beside the CPU", choice: netdevice.DeviceCPU, want: draftPlan{OnCPU: true}, whyHas: "--draft-device cpu"},
		{name: "gpu asked beside a GPU", choice: netdevice.DeviceGPU, accel: true, want: draftPlan{}, whyHas: "--draft-device gpu"},
		{name: "gpu asked, no GPU", choice: netdevice.DeviceGPU, wantErr: "not on an accelerator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := placeDraft(tc.choice, tc.accel, tc.times)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("placeDraft = %+v, %v; want an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.OnCPU != tc.want.OnCPU || got.Measure != tc.want.Measure {
				t.Errorf("placeDraft = %+v, want OnCPU %v, Measure %v", got, tc.want.OnCPU, tc.want.Measure)
			}
			if !got.Measure && !strings.Contains(got.Why, tc.whyHas) {
				t.Errorf("why %q does not say %q", got.Why, tc.whyHas)
			}
		})
	}
}

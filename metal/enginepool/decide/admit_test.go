package decide

import (
	"strings"
	"testing"
)

func TestAdmit(t *testing.T) {
	snap := func(level PressureLevel, committed int64, models ...Model) Snapshot {
		return Snapshot{Now: at(100), Limits: limits10, Level: level, Committed: committed, Usage: committed, Models: models}
	}
	measured := func(est, m int64) AdmitRequest {
		return AdmitRequest{Model: "new", Estimate: est * gib, Measured: m * gib}
	}
	for _, tc := range []struct {
		name       string
		snap       Snapshot
		req        AdmitRequest
		want       AdmitKind
		victim     string
		current    int64
		limit      int64
		detailHas  []string
		wantDetail bool
	}{
		{name: "gate: larger than the ceiling", snap: snap(PressureOK, 0),
			req: AdmitRequest{Model: "new", Estimate: 11 * gib, Measured: -1}, want: AdmitTooLarge, limit: 10 * gib},
		{name: "gate: exactly the ceiling passes", snap: snap(PressureOK, 0),
			req: AdmitRequest{Model: "new", Estimate: 10 * gib, Measured: -1}, want: AdmitMeasure},
		{name: "gate: paused under hard pressure, against the soft watermark", snap: snap(PressureHard, 2*gib, with(ready("pin", 2, 1), pinned)),
			req: AdmitRequest{Model: "new", Estimate: 1 * gib, Measured: -1}, want: AdmitRefuse, current: 2 * gib, limit: 9 * gib,
			detailHas: []string{"loads are paused under hard memory pressure", "memory is held by pin (pinned)"}},
		{name: "gate: paused under emergency", snap: snap(PressureEmergency, 0),
			req: AdmitRequest{Model: "new", Estimate: 1 * gib, Measured: -1}, want: AdmitRefuse, limit: 9 * gib,
			detailHas: []string{"emergency"}},
		{name: "gate: soft pressure does not stop the gate", snap: snap(PressureSoft, 0),
			req: AdmitRequest{Model: "new", Estimate: 1 * gib, Measured: -1}, want: AdmitMeasure},
		{name: "measured: the ceiling lowered meanwhile", snap: snap(PressureOK, 0),
			req: measured(11, 0), want: AdmitTooLarge, limit: 10 * gib},
		{name: "fits below the soft watermark", snap: snap(PressureOK, 3*gib, ready("a", 3, 1)),
			req: measured(4, 2), want: AdmitLoad, current: 3 * gib, limit: 10 * gib},
		{name: "the measured footprint counts when larger than the reservations", snap: snap(PressureOK, 3*gib),
			req: measured(4, 5), want: AdmitLoad, current: 5 * gib, limit: 10 * gib},
		{name: "above soft with no victim: admitted up to the ceiling", snap: snap(PressureOK, 6*gib, with(ready("a", 6, 1), busy)),
			req: measured(4, 6), want: AdmitLoad, current: 6 * gib, limit: 10 * gib},
		{name: "evicts down to the soft target first", snap: snap(PressureOK, 6*gib, ready("a", 3, 1), ready("b", 3, 2)),
			req: measured(4, 6), want: AdmitEvict, victim: "a", current: 6 * gib, limit: 10 * gib},
		{name: "never evicts itself", snap: snap(PressureOK, 6*gib, ready("new", 6, 1)),
			req: measured(4, 6), want: AdmitLoad, current: 6 * gib, limit: 10 * gib},
		{name: "after an eviction the reservations are trusted over the gauge", snap: snap(PressureOK, 3*gib, with(ready("b", 3, 2), busy)),
			req: AdmitRequest{Model: "new", Estimate: 4 * gib, Measured: 8 * gib, Evicted: true}, want: AdmitLoad, current: 3 * gib, limit: 10 * gib},
		{name: "soft pressure: the soft watermark is the limit", snap: snap(PressureSoft, 6*gib, with(ready("a", 6, 1), busy)),
			req: measured(4, 6), want: AdmitRefuse, current: 6 * gib, limit: 9 * gib,
			detailHas: []string{"loads are paused above the soft watermark under soft memory pressure", "a (busy)"}},
		{name: "does not fit: refused, naming what holds memory",
			snap: snap(PressureOK, 8*gib, with(ready("p", 3, 1), pinned), with(ready("b", 3, 1), busy), with(ready("l", 2, 1), loading)),
			req:  measured(3, 8), want: AdmitRefuse, current: 8 * gib, limit: 10 * gib,
			detailHas: []string{"memory is held by b (busy), l (loading), p (pinned)"}},
		{name: "waits for unloads in progress that make room", snap: snap(PressureOK, 8*gib, with(ready("b", 5, 1), busy), with(ready("d", 3, 1), draining)),
			req: measured(4, 8), want: AdmitWait, current: 8 * gib, limit: 10 * gib, detailHas: []string{"d (unloading)"}},
		{name: "does not wait for unloads that would not make room", snap: snap(PressureOK, 9*gib, with(ready("b", 8, 1), busy), with(ready("d", 1, 1), stopping)),
			req: measured(4, 9), want: AdmitRefuse, current: 9 * gib, limit: 10 * gib},
		{name: "a load still starting is not an unload to wait for", snap: snap(PressureOK, 8*gib, with(ready("b", 5, 1), busy), with(ready("l", 3, 1), loading, func(m *Model) { m.Engine.TearingDown = true })),
			req: measured(4, 8), want: AdmitRefuse, current: 8 * gib, limit: 10 * gib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Admit(tc.snap, tc.req)
			if d.Kind != tc.want || d.Victim != tc.victim {
				t.Fatalf("Admit = %s victim %q, want %s victim %q (%+v)", d.Kind, d.Victim, tc.want, tc.victim, d)
			}
			if d.Kind != AdmitMeasure && (d.Limit != tc.limit || d.Current != tc.current) {
				t.Fatalf("Admit counted current %d limit %d, want %d %d", d.Current, d.Limit, tc.current, tc.limit)
			}
			if d.Kind != AdmitMeasure && d.Kind != AdmitTooLarge && d.Projected != d.Current+tc.req.Estimate {
				t.Fatalf("projected %d, want current + estimate = %d", d.Projected, d.Current+tc.req.Estimate)
			}
			for _, s := range tc.detailHas {
				if !strings.Contains(d.Detail, s) {
					t.Errorf("detail %q lacks %q", d.Detail, s)
				}
			}
			if d.Kind == AdmitWait && d.Pending <= 0 {
				t.Errorf("a wait with nothing pending: %+v", d)
			}
		})
	}
}

// Every admission kind is produced by some snapshot, and named.
func TestAdmitKindsExhaustive(t *testing.T) {
	produced := map[AdmitKind]bool{}
	for _, level := range []PressureLevel{PressureOK, PressureSoft, PressureHard, PressureEmergency} {
		for _, models := range [][]Model{
			nil,
			{ready("a", 3, 1), ready("b", 3, 2)},
			{with(ready("b", 5, 1), busy), with(ready("d", 3, 1), draining)},
			{with(ready("b", 9, 1), busy)},
		} {
			for _, est := range []int64{1, 4, 11} {
				for _, m := range []int64{-1, 8} {
					s := Snapshot{Limits: limits10, Level: level, Committed: 8 * gib, Models: models}
					measured := m * gib
					if m < 0 {
						measured = -1
					}
					produced[Admit(s, AdmitRequest{Model: "new", Estimate: est * gib, Measured: measured}).Kind] = true
				}
			}
		}
	}
	covers(t, AdmitKinds, produced)
	distinctNames(t, AdmitKinds, "AdmitKind(")
}

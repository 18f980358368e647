package decide

import (
	"slices"
	"testing"
	"time"
)

func TestClassifyPressure(t *testing.T) {
	for _, tc := range []struct {
		name    string
		usage   int64
		overRun int
		want    PressureLevel
		wantRun int
	}{
		{"ok", 8 * gib, 0, PressureOK, 0},
		{"just below soft", 9*gib - 1, 0, PressureOK, 0},
		{"soft at the watermark", 9 * gib, 0, PressureSoft, 0},
		{"hard at the watermark", limits10.Hard, 0, PressureHard, 0},
		{"first poll at the ceiling is hard", 10 * gib, 0, PressureHard, 1},
		{"second poll at the ceiling is an emergency", 10 * gib, 1, PressureEmergency, 2},
		{"ceiling + 2 GiB is an emergency at once", 12 * gib, 0, PressureEmergency, 1},
		{"dropping below the ceiling resets the run", 9*gib + 600*mib, 1, PressureHard, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, run := ClassifyPressure(tc.usage, limits10, 2*gib, tc.overRun)
			if got != tc.want || run != tc.wantRun {
				t.Fatalf("ClassifyPressure = %s %d, want %s %d", got, run, tc.want, tc.wantRun)
			}
		})
	}
}

func TestEnforce(t *testing.T) {
	over := func(m *Model) { m.Engine.Footprint = m.Engine.OwnCeiling + 1 }
	for _, tc := range []struct {
		name     string
		models   []Model
		measured int64
		overRun  int
		hot      Poll // HotShrunk, HotHeld
		want     []Action
		level    PressureLevel
		shrink   bool
		shrunk   bool
	}{
		{name: "ok: nothing", models: []Model{ready("a", 3, 1), ready("b", 3, 2)}, measured: 6 * gib, level: PressureOK},
		{name: "ok: a runner over its own ceiling is unloaded, its requests aborted first",
			models: []Model{with(ready("a", 3, 1), over, busy), with(ready("b", 3, 1), over)}, measured: 6 * gib, level: PressureOK,
			want: []Action{{AbortRequests, "a"}, {UnloadOverCeiling, "a"}, {UnloadOverCeiling, "b"}}},
		{name: "ok: over-ceiling acted on once", models: []Model{with(ready("a", 3, 1), over, func(m *Model) { m.Engine.OverCeiling = true })},
			measured: 6 * gib, level: PressureOK},
		{name: "ok: over-ceiling needs a reservation", models: []Model{with(ready("a", 0, 1), footprint(gib))},
			measured: 6 * gib, level: PressureOK},
		{name: "soft: the idle LRU goes while more than one non-pinned is loaded",
			models: []Model{ready("a", 3, 5), ready("b", 3, 1), with(ready("p", 3, 0), pinned)}, measured: 9 * gib, level: PressureSoft,
			want: []Action{{UnloadPressure, "b"}}},
		{name: "soft: one non-pinned model stays", models: []Model{ready("a", 3, 5), with(ready("p", 6, 0), pinned)},
			measured: 9 * gib, level: PressureSoft},
		{name: "soft: nothing while an unload is under way", models: []Model{ready("a", 3, 5), ready("b", 3, 1), with(ready("d", 1, 0), draining)},
			measured: 9 * gib, level: PressureSoft},
		{name: "hard: loads are canceled and an idle victim evicted down to soft",
			models:   []Model{ready("big", 4, 9), ready("small", 1, 1), with(ready("l", 2, 0), loading), with(ready("q", 2, 0), unadmitted)},
			measured: 9*gib + 600*mib, level: PressureHard, shrink: true, shrunk: true,
			want: []Action{{UnloadPressure, "l"}, {UnloadPressure, "q"}, {UnloadPressure, "small"}}},
		{name: "hard: none covers the need alone, the largest goes",
			models:   []Model{with(ready("big", 0, 9), footprint(500*mib)), with(ready("old", 0, 1), footprint(300*mib))},
			measured: 9*gib + 600*mib, level: PressureHard, shrink: true, shrunk: true,
			want: []Action{{UnloadPressure, "big"}}},
		{name: "hard: without an idle victim, the LRU busy model's requests are aborted",
			models:   []Model{with(ready("new", 3, 9), busy), with(ready("old", 3, 1), busy), with(ready("p", 3, 0), pinned)},
			measured: 9*gib + 600*mib, level: PressureHard, shrink: true, shrunk: true,
			want: []Action{{AbortRequests, "old"}}},
		{name: "hard: LRU busy ties go to the name",
			models:   []Model{with(ready("y", 3, 1), busy), with(ready("x", 3, 1), busy)},
			measured: 9*gib + 600*mib, level: PressureHard, shrink: true, shrunk: true,
			want: []Action{{AbortRequests, "x"}}},
		{name: "hard: unloads under way already cover the need",
			models:   []Model{ready("a", 3, 1), with(ready("d", 1, 0), stopping)},
			measured: 9*gib + 600*mib, level: PressureHard, shrink: true, shrunk: true},
		{name: "hard: the hot tiers' reclaim covers the need",
			models: []Model{ready("a", 3, 1)}, hot: Poll{HotHeld: gib},
			measured: 9*gib + 600*mib, level: PressureHard, shrink: true, shrunk: true},
		{name: "hard: hot tiers already shrunk reclaim nothing more",
			models: []Model{ready("a", 3, 1)}, hot: Poll{HotShrunk: true, HotHeld: gib},
			measured: 9*gib + 600*mib, level: PressureHard, shrunk: true,
			want: []Action{{UnloadPressure, "a"}}},
		{name: "hard: an over-ceiling unload counts toward the need",
			models:   []Model{with(ready("a", 3, 1), over), ready("b", 3, 2)},
			measured: 9*gib + 600*mib, level: PressureHard, shrink: true, shrunk: true,
			want: []Action{{UnloadOverCeiling, "a"}}},
		{name: "emergency: loads canceled, everything in flight aborted, non-pinned unloaded",
			models: []Model{with(ready("busy", 3, 1), busy), ready("idle", 1, 1), with(ready("pin", 3, 1), pinned, busy),
				with(ready("l", 2, 1), loading), with(ready("d", 1, 0), draining, busy)},
			measured: 12 * gib, level: PressureEmergency, shrink: true, shrunk: true,
			want: []Action{{AbortRequests, "busy"}, {UnloadPressure, "busy"}, {AbortRequests, "d"}, {UnloadPressure, "idle"},
				{UnloadPressure, "l"}, {AbortRequests, "pin"}}},
		{name: "emergency after two polls at the ceiling", models: []Model{ready("a", 3, 1)},
			measured: 10 * gib, overRun: 1, level: PressureEmergency, shrink: true, shrunk: true,
			want: []Action{{UnloadPressure, "a"}}},
		{name: "ok again: the hot tiers come back", models: []Model{ready("a", 3, 1)}, hot: Poll{HotShrunk: true},
			measured: 3 * gib, level: PressureOK},
		{name: "soft keeps the hot tiers as they are", models: []Model{ready("a", 3, 1)}, hot: Poll{HotShrunk: true},
			measured: 9 * gib, level: PressureSoft, shrunk: true},
		{name: "idle expiry: past the timeout, never leased, never without one",
			models: []Model{with(ready("old", 1, 40), idleAfter(time.Minute)), with(ready("fresh", 1, 41), idleAfter(time.Minute)),
				with(ready("leased", 1, 0), idleAfter(time.Minute), busy), ready("resident", 1, 0),
				with(ready("unloading", 1, 0), idleAfter(time.Minute), draining)},
			measured: 3 * gib, level: PressureOK,
			want: []Action{{UnloadIdle, "old"}}},
		{name: "idle expiry skips what pressure already unloads",
			models:   []Model{with(ready("a", 3, 0), idleAfter(time.Second)), with(ready("b", 3, 1), idleAfter(time.Second))},
			measured: 9 * gib, level: PressureSoft,
			want: []Action{{UnloadPressure, "a"}, {UnloadIdle, "b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Snapshot{Now: at(100), Limits: limits10, Models: tc.models}
			in := tc.hot
			in.Measured, in.OverRun, in.EmergencyMargin = tc.measured, tc.overRun, 2*gib
			d := Enforce(s, in)
			if d.Level != tc.level || d.ShrinkHot != tc.shrink || d.HotShrunk != tc.shrunk {
				t.Fatalf("Enforce: level %s shrink %v shrunk %v, want %s %v %v", d.Level, d.ShrinkHot, d.HotShrunk, tc.level, tc.shrink, tc.shrunk)
			}
			if d.ShrinkHot && d.HotReclaim != in.HotHeld || !d.ShrinkHot && d.HotReclaim != 0 {
				t.Fatalf("hot reclaim %d with shrink %v, held %d", d.HotReclaim, d.ShrinkHot, in.HotHeld)
			}
			if !slices.Equal(d.Actions, tc.want) {
				t.Fatalf("actions = %v, want %v", d.Actions, tc.want)
			}
			for i, m := range tc.models {
				if m.Engine != nil && s.Models[i].Engine != m.Engine {
					t.Fatalf("Enforce changed the snapshot")
				}
			}
		})
	}
}

// The snapshot is read, never written: the simulation works on a copy.
func TestEnforceLeavesTheSnapshotAlone(t *testing.T) {
	models := []Model{ready("a", 3, 0), ready("b", 3, 1)}
	before := []Engine{*models[0].Engine, *models[1].Engine}
	d := Enforce(Snapshot{Now: at(100), Limits: limits10, Models: models}, Poll{Measured: 12 * gib, EmergencyMargin: 2 * gib})
	if len(d.Actions) != 2 {
		t.Fatalf("actions = %v, want both unloaded", d.Actions)
	}
	for i, m := range models {
		if m.State != StateReady || *m.Engine != before[i] {
			t.Fatalf("model %s changed: %+v %+v", m.Name, m, *m.Engine)
		}
	}
}

// Every action kind is produced by some snapshot, and named.
func TestActionKindsExhaustive(t *testing.T) {
	produced := map[ActionKind]bool{}
	over := func(m *Model) { m.Engine.Footprint = m.Engine.OwnCeiling + 1 }
	for _, measured := range []int64{3, 9, 10, 13} {
		for _, models := range [][]Model{
			{with(ready("a", 3, 1), busy), with(ready("b", 3, 1), over)},
			{with(ready("a", 3, 1), idleAfter(time.Second)), ready("b", 3, 2)},
		} {
			d := Enforce(Snapshot{Now: at(100), Limits: limits10, Models: models}, Poll{Measured: measured * gib, EmergencyMargin: 2 * gib})
			for _, a := range d.Actions {
				produced[a.Kind] = true
			}
		}
	}
	covers(t, ActionKinds, produced)
	distinctNames(t, ActionKinds, "ActionKind(")
}

func TestNextPoll(t *testing.T) {
	iv := Intervals{Active: time.Second, Idle: 10 * time.Second, Empty: 30 * time.Second}
	for _, tc := range []struct {
		name   string
		level  PressureLevel
		models []Model
		want   time.Duration
	}{
		{name: "empty", want: 30 * time.Second},
		{name: "registered, nothing loaded", models: []Model{{Name: "a", State: StateUnloaded}}, want: 30 * time.Second},
		{name: "loaded and idle", models: []Model{ready("a", 1, 0)}, want: 10 * time.Second},
		{name: "serving", models: []Model{with(ready("a", 1, 0), busy)}, want: time.Second},
		{name: "loading", models: []Model{with(ready("a", 1, 0), unadmitted)}, want: time.Second},
		{name: "unloading", models: []Model{with(ready("a", 1, 0), stopping)}, want: time.Second},
		{name: "pressure", level: PressureSoft, models: []Model{ready("a", 1, 0)}, want: time.Second},
		{name: "an idle expiry comes first", models: []Model{with(ready("a", 1, 97), idleAfter(5*time.Second))}, want: 2 * time.Second},
		{name: "an expiry already due: at least 10ms", models: []Model{with(ready("a", 1, 0), idleAfter(5*time.Second))}, want: 10 * time.Millisecond},
		{name: "a leased model's expiry does not count", models: []Model{with(ready("a", 1, 97), idleAfter(5*time.Second), busy)}, want: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			level := tc.level
			if level == "" {
				level = PressureOK
			}
			got := NextPoll(Snapshot{Now: at(100), Level: level, Models: tc.models}, iv)
			if got != tc.want {
				t.Fatalf("NextPoll = %s, want %s", got, tc.want)
			}
		})
	}
}

package decide

import (
	"strings"
	"testing"
	"time"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// epoch is the fake clock's zero: every time in these tests is epoch + seconds.
var epoch = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

func at(s int) time.Time { return epoch.Add(time.Duration(s) * time.Second) }

// ready is an idle Ready model of g GiB (reserved and measured), last used at s.
func ready(name string, g int64, s int) Model {
	return Model{Name: name, State: StateReady, LastUsed: at(s),
		Engine: &Engine{Running: true, Footprint: g * gib, Reservation: g * gib, OwnCeiling: g*gib + g*gib/10}}
}

// with applies changes to a copy of m (and of its engine).
func with(m Model, changes ...func(*Model)) Model {
	if m.Engine != nil {
		g := *m.Engine
		m.Engine = &g
	}
	for _, c := range changes {
		c(&m)
	}
	return m
}

func pinned(m *Model)     { m.Pinned = true }
func busy(m *Model)       { m.Engine.InUse = 1 }
func draining(m *Model)   { m.State, m.Engine.TearingDown = StateDraining, true }
func stopping(m *Model)   { m.State, m.Engine.TearingDown = StateStopping, true }
func loading(m *Model)    { m.State, m.Engine.Running = StateLoading, false }
func unadmitted(m *Model) { m.State, m.Engine = StateLoading, nil }
func idleAfter(d time.Duration) func(*Model) {
	return func(m *Model) { m.IdleTimeout = d }
}
func footprint(b int64) func(*Model) { return func(m *Model) { m.Engine.Footprint = b } }

// limits10 is a 10 GiB ceiling: soft 9 GiB, hard 9.5 GiB.
var limits10 = Limits{Ceiling: 10 * gib, Soft: 9 * gib, Hard: 9*gib + 512*mib}

// covers fails t unless every kind in all was produced by some case.
func covers[K comparable](t *testing.T, all []K, produced map[K]bool) {
	t.Helper()
	var missing []K
	for _, k := range all {
		if !produced[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("no table case produces %v: every decision kind needs a case", missing)
	}
}

// distinctNames fails t unless every kind has its own name, none the fallback.
func distinctNames[K interface {
	comparable
	String() string
}](t *testing.T, all []K, fallback string) {
	t.Helper()
	seen := map[string]bool{}
	for _, k := range all {
		n := k.String()
		if seen[n] || strings.HasPrefix(n, fallback) {
			t.Errorf("kind %v is named %q: duplicated or unnamed", k, n)
		}
		seen[n] = true
	}
	if len(seen) != len(all) {
		t.Errorf("%d names for %d kinds", len(seen), len(all))
	}
}

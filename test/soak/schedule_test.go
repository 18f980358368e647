package soak

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var topo = Topology{Nodes: []string{"mac-a", "mac-b"}, Gateways: 2}

func TestPlan(t *testing.T) {
	for _, d := range []time.Duration{90 * time.Second, 3 * time.Minute, 10 * time.Minute, time.Hour} {
		for _, seed := range []uint64{0, 1, 42, 1 << 40} {
			faults, err := Plan(seed, d, topo)
			if err != nil {
				t.Fatalf("Plan(%d, %s): %v", seed, d, err)
			}
			from, to := Window(d)
			seen := map[Kind]int{}
			for i, f := range faults {
				seen[f.Kind]++
				if f.At < from || f.End() > to {
					t.Errorf("Plan(%d, %s): %s is outside the window [%s, %s]", seed, d, f, from, to)
				}
				if i > 0 && faults[i-1].End()+Gap(d) > f.At {
					t.Errorf("Plan(%d, %s): %s starts less than %s after %s", seed, d, f, Gap(d), faults[i-1])
				}
				if f.Hold <= 0 {
					t.Errorf("Plan(%d, %s): %s has no hold", seed, d, f)
				}
				switch f.Kind {
				case KillAgent, KillRunner, FillDisk:
					if f.Node != "mac-a" && f.Node != "mac-b" {
						t.Errorf("Plan(%d, %s): %s targets no node of the topology", seed, d, f)
					}
				case KillGateway:
					if f.Gateway < 0 || f.Gateway >= topo.Gateways {
						t.Errorf("Plan(%d, %s): %s targets no gateway of the topology", seed, d, f)
					}
				}
			}
			for _, k := range Kinds {
				if seen[k] == 0 {
					t.Errorf("Plan(%d, %s) has no %s: %v", seed, d, k, faults)
				}
			}
			if d >= 10*time.Minute && len(faults) < 3*len(Kinds) {
				t.Errorf("Plan(%d, %s) has %d faults, want several rounds", seed, d, len(faults))
			}
		}
	}
}

func TestPlanCutsTheAPIServerFor30sInALongSoak(t *testing.T) {
	faults, err := Plan(7, 10*time.Minute, topo)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range faults {
		if f.Kind == CutAPIServer && f.Hold != 30*time.Second {
			t.Errorf("%s: want a 30s cut", f)
		}
	}
}

func TestPlanIsDeterministicPerSeed(t *testing.T) {
	a, _ := Plan(1, 10*time.Minute, topo)
	b, _ := Plan(1, 10*time.Minute, topo)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("two plans of seed 1 differ (-first +second):\n%s", diff)
	}
	c, _ := Plan(2, 10*time.Minute, topo)
	if cmp.Equal(a, c) {
		t.Errorf("seeds 1 and 2 give the same plan %v", a)
	}
}

func TestPlanRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    time.Duration
		topo Topology
	}{
		{"too short", 30 * time.Second, topo},
		{"no nodes", time.Hour, Topology{Gateways: 1}},
		{"no gateways", time.Hour, Topology{Nodes: []string{"mac-a"}}},
	} {
		if faults, err := Plan(1, tc.d, tc.topo); err == nil {
			t.Errorf("%s: Plan = %v, want an error", tc.name, faults)
		}
	}
}

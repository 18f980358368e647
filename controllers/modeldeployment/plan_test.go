package modeldeployment

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// rep builds a replicaInfo: flags is any of "c" current, "r" ready, "b" bound;
// age orders creation (higher is newer).
func rep(name, flags string, age int) replicaInfo {
	r := replicaInfo{Name: name, Created: t0.Add(time.Duration(age) * time.Second)}
	for _, f := range flags {
		switch f {
		case 'c':
			r.Current = true
		case 'r':
			r.Ready = true
		case 'b':
			r.Bound = true
		}
	}
	return r
}

// pressed sets the pressure rank of r's Mac.
func pressed(r replicaInfo, rank int) replicaInfo {
	r.Pressure = rank
	return r
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name     string
		desired  int
		replicas []replicaInfo
		want     actions
	}{
		{"create from nothing", 3, nil, actions{Create: 3}},
		{"steady", 2, []replicaInfo{rep("a", "crb", 1), rep("b", "crb", 2)}, actions{}},
		{"steady while loading", 2, []replicaInfo{rep("a", "cb", 1), rep("b", "c", 2)}, actions{}},
		{"scale up", 4, []replicaInfo{rep("a", "crb", 1), rep("b", "crb", 2)}, actions{Create: 2}},
		{"zero", 0, []replicaInfo{rep("a", "crb", 1), rep("b", "c", 2)}, actions{Delete: []string{"b", "a"}}},
		{"negative is zero", -1, []replicaInfo{rep("a", "crb", 1)}, actions{Delete: []string{"a"}}},

		// Scale down order: unbound, then not ready, then newest.
		{"scale down unbound first", 3, []replicaInfo{
			rep("old-ready", "crb", 1), rep("new-ready", "crb", 9), rep("bound-loading", "cb", 5), rep("unbound", "c", 2),
		}, actions{Delete: []string{"unbound"}}},
		{"scale down then not ready", 2, []replicaInfo{
			rep("old-ready", "crb", 1), rep("new-ready", "crb", 9), rep("bound-loading", "cb", 5), rep("unbound", "c", 2),
		}, actions{Delete: []string{"unbound", "bound-loading"}}},
		{"scale down then newest", 1, []replicaInfo{
			rep("old-ready", "crb", 1), rep("new-ready", "crb", 9), rep("bound-loading", "cb", 5), rep("unbound", "c", 2),
		}, actions{Delete: []string{"unbound", "bound-loading", "new-ready"}}},
		{"newest unbound before older unbound", 1, []replicaInfo{
			rep("u1", "c", 1), rep("u2", "c", 2), rep("u3", "c", 3),
		}, actions{Delete: []string{"u3", "u2"}}},
		{"scale down: the Mac under most memory pressure first", 2, []replicaInfo{
			rep("calm-new", "crb", 9), pressed(rep("hard-old", "crb", 1), 2), pressed(rep("soft", "crb", 5), 1),
		}, actions{Delete: []string{"hard-old"}}},
		{"scale down: pressure, then newest", 1, []replicaInfo{
			rep("calm-new", "crb", 9), pressed(rep("soft-old", "crb", 1), 1), pressed(rep("soft-new", "crb", 5), 1),
		}, actions{Delete: []string{"soft-new", "soft-old"}}},
		{"scale down: not ready before pressure", 2, []replicaInfo{
			pressed(rep("emergency", "crb", 1), 3), rep("loading", "cb", 2), rep("ready", "crb", 3),
		}, actions{Delete: []string{"loading"}}},
		{"same age: by name, last first", 1, []replicaInfo{
			rep("x-a", "crb", 1), rep("x-c", "crb", 1), rep("x-b", "crb", 1),
		}, actions{Delete: []string{"x-c", "x-b"}}},

		// Rolling update, desired 3, maxSurge 1, maxUnavailable 0.
		{"rollout starts with one surge replica", 3, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "rb", 2), rep("o3", "rb", 3),
		}, actions{Create: 1}},
		{"rollout waits for the new replica", 3, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "rb", 2), rep("o3", "rb", 3), rep("n1", "cb", 4),
		}, actions{}},
		{"rollout: new ready → delete one old, surge again", 3, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "rb", 2), rep("o3", "rb", 3), rep("n1", "crb", 4),
		}, actions{Create: 1, Delete: []string{"o3"}}},
		{"rollout: second step", 3, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "rb", 2), rep("n1", "crb", 4), rep("n2", "crb", 5),
		}, actions{Create: 1, Delete: []string{"o2"}}},
		{"rollout: last old goes", 3, []replicaInfo{
			rep("o1", "rb", 1), rep("n1", "crb", 4), rep("n2", "crb", 5), rep("n3", "crb", 6),
		}, actions{Delete: []string{"o1"}}},
		{"rollout of one replica", 1, []replicaInfo{rep("o1", "rb", 1)}, actions{Create: 1}},
		{"rollout of one replica, new ready", 1, []replicaInfo{rep("o1", "rb", 1), rep("n1", "crb", 2)}, actions{Delete: []string{"o1"}}},

		// Stuck rollouts hold at desired+1 with the old replicas serving.
		{"stuck: new replica unschedulable", 3, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "rb", 2), rep("o3", "rb", 3), rep("n1", "c", 4),
		}, actions{}},
		{"stuck: new replica never ready", 2, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "rb", 2), rep("n1", "cb", 4),
		}, actions{}},

		// Old replicas that are not ready serve nothing and go at once.
		{"old not ready deleted first", 2, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "b", 2), rep("o3", "", 3),
		}, actions{Create: 2, Delete: []string{"o2", "o3"}}},
		{"all old not ready: replace at once", 3, []replicaInfo{
			rep("o1", "b", 1), rep("o2", "", 2), rep("o3", "b", 3),
		}, actions{Create: 3, Delete: []string{"o1", "o2", "o3"}}},
		{"template changed again mid-rollout", 3, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "rb", 2), rep("o3", "rb", 3), rep("mid", "b", 4),
		}, actions{Create: 1, Delete: []string{"mid"}}},

		// Scaling during a rollout.
		{"scale up mid-rollout surges once", 5, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "rb", 2), rep("o3", "rb", 3),
		}, actions{Create: 3}},
		{"scale down mid-rollout keeps ready", 1, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "rb", 2), rep("n1", "crb", 3), rep("n2", "cb", 4),
		}, actions{Delete: []string{"n2", "o2", "o1"}}},
		{"scale down mid-rollout without ready new", 1, []replicaInfo{
			rep("o1", "rb", 1), rep("o2", "rb", 2), rep("n1", "c", 3),
		}, actions{Delete: []string{"o2"}}},
		{"scale to zero mid-rollout", 0, []replicaInfo{
			rep("o1", "rb", 1), rep("n1", "cb", 3),
		}, actions{Delete: []string{"n1", "o1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.replicas)
			got := plan(tt.desired, in)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("plan(%d) mismatch (-want +got):\n%s", tt.desired, diff)
			}
		})
	}
}

// TestPlanRolloutConverges plays a rollout pass by pass: each created replica becomes
// ready one pass later. At every step the ready replicas must cover desired and the
// total must stay within desired+maxSurge, and the rollout must finish.
func TestPlanRolloutConverges(t *testing.T) {
	for _, desired := range []int{1, 2, 3, 7} {
		t.Run(fmt.Sprint(desired), func(t *testing.T) {
			var reps []replicaInfo
			for i := range desired {
				reps = append(reps, rep(fmt.Sprintf("o%d", i), "rb", i))
			}
			n := 0
			for pass := 0; ; pass++ {
				if pass > 4*desired+4 {
					t.Fatalf("no convergence after %d passes: %+v", pass, reps)
				}
				// Replicas created in the previous pass became ready.
				for i := range reps {
					reps[i].Ready, reps[i].Bound = true, true
				}
				act := plan(desired, reps)
				if act.Create == 0 && len(act.Delete) == 0 {
					break
				}
				reps = slices.DeleteFunc(reps, func(r replicaInfo) bool { return slices.Contains(act.Delete, r.Name) })
				ready := 0
				for _, r := range reps {
					if r.Ready {
						ready++
					}
				}
				if ready < desired {
					t.Fatalf("pass %d: %d ready after deleting %v, want at least %d", pass, ready, act.Delete, desired)
				}
				for range act.Create {
					n++
					reps = append(reps, rep(fmt.Sprintf("n%d", n), "c", 100+n))
				}
				if len(reps) > desired+maxSurge {
					t.Fatalf("pass %d: %d replicas, want at most %d", pass, len(reps), desired+maxSurge)
				}
			}
			if len(reps) != desired {
				t.Fatalf("ended with %d replicas, want %d", len(reps), desired)
			}
			for _, r := range reps {
				if !r.Current {
					t.Errorf("old replica %s left", r.Name)
				}
			}
		})
	}
}

package scheduler

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestPlacement creates a fleet, its deployments and replicas, then starts the
// scheduler and checks where every replica went, or why it could not go anywhere.
func TestPlacement(t *testing.T) {
	type dep struct {
		name      string
		placement v1alpha1.Placement
	}
	tests := []struct {
		name     string
		nodes    []nodeSpec
		deps     []dep
		replicas []replicaSpec
		// want maps each replica to its node's short name, or to "!" and the reason
		// code it is unschedulable with. Replicas created bound are left out.
		want map[string]string
		// orphans are replicas whose deployment does not exist: left alone.
		orphans []string
	}{
		{
			name: "fit counts the memory bound replicas reserve",
			nodes: []nodeSpec{
				{name: "small", ceiling: 16},
				{name: "big", ceiling: 64},
				{name: "huge", ceiling: 72},
			},
			deps: []dep{{name: "hog"}, {name: "d"}},
			replicas: []replicaSpec{
				{name: "hog-0", deployment: "hog", memory: 56, node: "big"},
				{name: "d-0", deployment: "d", memory: 20},
			},
			// BinPack would take big (64 < 72) if its 56GiB of reservations were ignored.
			want: map[string]string{"d-0": "huge"},
		},
		{
			name: "node selector",
			nodes: []nodeSpec{
				{name: "m2", ceiling: 32, labels: map[string]string{v1alpha1.LabelChip: "M2"}},
				{name: "m4", ceiling: 128, labels: map[string]string{v1alpha1.LabelChip: "M4"}},
			},
			deps: []dep{
				{name: "m4-only", placement: v1alpha1.Placement{NodeSelector: map[string]string{v1alpha1.LabelChip: "M4"}}},
				{name: "m1-only", placement: v1alpha1.Placement{NodeSelector: map[string]string{v1alpha1.LabelChip: "M1"}}},
			},
			replicas: []replicaSpec{
				{name: "a", deployment: "m4-only", memory: 8},
				{name: "b", deployment: "m1-only", memory: 8},
			},
			want: map[string]string{"a": "m4", "b": "!NodeSelectorMismatch"},
		},
		{
			name:  "BinPack fills the tightest Mac",
			nodes: []nodeSpec{{name: "a", ceiling: 32}, {name: "b", ceiling: 48}, {name: "c", ceiling: 64}},
			deps:  []dep{{name: "d", placement: v1alpha1.Placement{Strategy: v1alpha1.BinPack, MaxReplicasPerNode: 3}}},
			replicas: []replicaSpec{
				{name: "d-0", deployment: "d", memory: 8},
				{name: "d-1", deployment: "d", memory: 8},
				{name: "d-2", deployment: "d", memory: 8},
			},
			want: map[string]string{"d-0": "a", "d-1": "a", "d-2": "a"},
		},
		{
			name:  "Spread uses every Mac",
			nodes: []nodeSpec{{name: "a", ceiling: 32}, {name: "b", ceiling: 48}, {name: "c", ceiling: 64}},
			deps:  []dep{{name: "d", placement: v1alpha1.Placement{Strategy: v1alpha1.Spread, MaxReplicasPerNode: 3}}},
			replicas: []replicaSpec{
				{name: "d-0", deployment: "d", memory: 8},
				{name: "d-1", deployment: "d", memory: 8},
				{name: "d-2", deployment: "d", memory: 8},
			},
			want: map[string]string{"d-0": "c", "d-1": "b", "d-2": "a"},
		},
		{
			name:  "a cordoned Mac gets nothing new",
			nodes: []nodeSpec{{name: "roomy", ceiling: 64, cordoned: true}, {name: "tight", ceiling: 8}},
			deps:  []dep{{name: "small"}, {name: "large"}},
			replicas: []replicaSpec{
				{name: "small-0", deployment: "small", memory: 4},
				{name: "large-0", deployment: "large", memory: 16},
			},
			want: map[string]string{"small-0": "tight", "large-0": "!NodeCordoned"},
		},
		{
			name:  "OnDemand replicas reserve nothing",
			nodes: []nodeSpec{{name: "a", ceiling: 10}},
			deps:  []dep{{name: "x"}, {name: "y"}},
			replicas: []replicaSpec{
				{name: "x-0", deployment: "x", memory: 8, residency: v1alpha1.ResidencyOnDemand},
				{name: "y-0", deployment: "y", memory: 8, residency: v1alpha1.ResidencyOnDemand},
			},
			want: map[string]string{"x-0": "a", "y-0": "a"},
		},
		{
			name:  "Resident replicas of the same size do reserve",
			nodes: []nodeSpec{{name: "a", ceiling: 10}},
			deps:  []dep{{name: "x"}, {name: "y"}},
			replicas: []replicaSpec{
				{name: "x-0", deployment: "x", memory: 8, residency: v1alpha1.ResidencyResident},
				{name: "y-0", deployment: "y", memory: 8, residency: v1alpha1.ResidencyPinned},
			},
			want: map[string]string{"x-0": "a", "y-0": "!InsufficientMemory"},
		},
		{
			name:     "spec.memoryCeiling lowers the agent's ceiling",
			nodes:    []nodeSpec{{name: "a", ceiling: 64, specCeiling: 8}},
			deps:     []dep{{name: "d"}, {name: "e"}},
			replicas: []replicaSpec{{name: "d-0", deployment: "d", memory: 16}, {name: "e-0", deployment: "e", memory: 4}},
			want:     map[string]string{"d-0": "!InsufficientMemory", "e-0": "a"},
		},
		{
			name:     "not ready, or no ceiling reported yet",
			nodes:    []nodeSpec{{name: "down", ceiling: 64, notReady: true}, {name: "new"}},
			deps:     []dep{{name: "d"}},
			replicas: []replicaSpec{{name: "d-0", deployment: "d", memory: 1}},
			want:     map[string]string{"d-0": "!NodeNotReady"},
		},
		{
			name:  "one replica per Mac by default",
			nodes: []nodeSpec{{name: "a", ceiling: 64}},
			deps:  []dep{{name: "d"}},
			replicas: []replicaSpec{
				{name: "d-0", deployment: "d", memory: 2},
				{name: "d-1", deployment: "d", memory: 1},
			},
			want: map[string]string{"d-0": "a", "d-1": "!MaxReplicasPerNode"},
		},
		{
			name:     "no Macs at all",
			deps:     []dep{{name: "d"}},
			replicas: []replicaSpec{{name: "d-0", deployment: "d", memory: 1}},
			want:     map[string]string{"d-0": "!NoNodes"},
		},
		{
			name:     "a replica without its deployment is left alone",
			nodes:    []nodeSpec{{name: "a", ceiling: 64}},
			deps:     []dep{{name: "d"}},
			replicas: []replicaSpec{{name: "lost-0", deployment: "lost", memory: 1}, {name: "d-0", deployment: "d", memory: 1}},
			want:     map[string]string{"d-0": "a"},
			orphans:  []string{"lost-0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			for _, n := range tt.nodes {
				f.createNode(n)
			}
			for _, d := range tt.deps {
				f.createDeployment(d.name, d.placement)
			}
			for _, r := range tt.replicas {
				f.createReplica(r)
			}
			f.startScheduler()

			got := map[string]string{}
			for name, want := range tt.want {
				if code, ok := strings.CutPrefix(want, "!"); ok {
					r := f.waitScheduled(name, metav1.ConditionFalse, code)
					c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled)
					if r.Spec.NodeName != "" {
						t.Errorf("unschedulable replica %s is bound to %s", name, r.Spec.NodeName)
					}
					if !strings.HasPrefix(c.Message, "0/") {
						t.Errorf("replica %s: message %q is not kube-scheduler style", name, c.Message)
					}
					f.waitEvent(name, EventFailedScheduling, c.Message)
					got[name] = "!" + c.Reason
					continue
				}
				r := f.waitScheduled(name, metav1.ConditionTrue, v1alpha1.ReasonBound)
				got[name] = f.short(r.Spec.NodeName)
				c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled)
				if want := "Bound to " + r.Spec.NodeName; c.Message != want {
					t.Errorf("replica %s: Scheduled message %q, want %q", name, c.Message, want)
				}
				f.waitEvent(name, EventScheduled, "Bound to "+r.Spec.NodeName)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("placement (-want +got):\n%s", diff)
			}
			// Every verdict above was written by a pass that saw the orphans too.
			for _, name := range tt.orphans {
				r := f.replica(name)
				if r.Spec.NodeName != "" || meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled) != nil {
					t.Errorf("orphan %s was touched: nodeName %q, conditions %+v", name, r.Spec.NodeName, r.Status.Conditions)
				}
			}
		})
	}
}

// TestUnschedulableRetried: a replica no Mac fits gets a reason, the reason is not
// rewritten by solves that do not change it, and the replica is bound as soon as a
// fitting Mac becomes ready — driven by the MacNode events, not by polling.
func TestUnschedulableRetried(t *testing.T) {
	f := newFixture(t)
	sched := f.startScheduler()
	bindings0 := testutil.ToFloat64(bindingsTotal)
	latency0 := histogramCount(t, schedulingLatency)

	f.createNode(nodeSpec{name: "small", ceiling: 8})
	f.createDeployment("big", v1alpha1.Placement{})
	// The first verdict must already be the final one: it is counted below.
	f.waitCached(sched, []string{"small"}, []string{"big"})
	f.createReplica(replicaSpec{name: "big-0", deployment: "big", memory: 20})

	r := f.waitScheduled("big-0", metav1.ConditionFalse, string(ReasonInsufficientMemory))
	const msg = "0/1 Macs fit: 1 insufficient memory (need 20.0GiB, largest free 8.0GiB)"
	if c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled); c.Message != msg {
		t.Errorf("message %q, want %q", c.Message, msg)
	}
	f.waitEvent("big-0", EventFailedScheduling, msg)
	if got := testutil.ToFloat64(unschedulableReplicas); got != 1 {
		t.Errorf("%s = %v, want 1", MetricUnschedulableReplicas, got)
	}

	// Solves that reach the same verdict write nothing: relabelling the node triggers
	// a solve each time.
	rv := r.ResourceVersion
	for i := range 3 {
		solves := histogramCount(t, solveDuration)
		f.patchNode("small", false, func(n *v1alpha1.MacNode) { n.Labels["round"] = fmt.Sprint(i) })
		testenv.Eventually(t, wait, poll, func() (bool, string) {
			return histogramCount(t, solveDuration) > solves, "no solve after relabelling the node"
		})
	}
	if got := f.replica("big-0").ResourceVersion; got != rv {
		t.Errorf("an unchanged verdict was rewritten: resourceVersion %s → %s", rv, got)
	}
	if n := len(f.events("big-0", EventFailedScheduling)); n != 1 {
		t.Errorf("%d FailedScheduling Events for an unchanged verdict, want 1", n)
	}

	// A fitting Mac appears, not ready yet: the verdict changes.
	f.createNode(nodeSpec{name: "roomy", ceiling: 32, notReady: true})
	const msg2 = "0/2 Macs fit: 1 not ready, 1 insufficient memory (need 20.0GiB, largest free 8.0GiB)"
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		c := meta.FindStatusCondition(f.replica("big-0").Status.Conditions, v1alpha1.ReplicaScheduled)
		return c != nil && c.Message == msg2, fmt.Sprintf("Scheduled %+v, want message %q", c, msg2)
	})
	// Its agent reports Ready: the replica is bound there.
	f.patchNode("roomy", true, func(n *v1alpha1.MacNode) { n.Status.Conditions[0].Status = metav1.ConditionTrue })
	r = f.waitScheduled("big-0", metav1.ConditionTrue, v1alpha1.ReasonBound)
	if r.Spec.NodeName != f.node("roomy") {
		t.Errorf("bound to %s, want %s", r.Spec.NodeName, f.node("roomy"))
	}
	f.waitEvent("big-0", EventScheduled, "Bound to "+f.node("roomy"))

	testenv.Eventually(t, wait, poll, func() (bool, string) {
		got := testutil.ToFloat64(unschedulableReplicas)
		return got == 0, fmt.Sprintf("%s = %v, want 0", MetricUnschedulableReplicas, got)
	})
	if got := testutil.ToFloat64(bindingsTotal) - bindings0; got != 1 {
		t.Errorf("%s grew by %v, want 1", MetricBindingsTotal, got)
	}
	if got := histogramCount(t, schedulingLatency) - latency0; got != 1 {
		t.Errorf("%s has %d new observations, want 1", MetricSchedulingLatency, got)
	}
}

// TestRetriedWhenReservationFreed: a replica that does not fit because of another
// replica's reservation is bound once that replica is deleted.
func TestRetriedWhenReservationFreed(t *testing.T) {
	f := newFixture(t)
	f.createNode(nodeSpec{name: "a", ceiling: 10})
	f.createDeployment("hog", v1alpha1.Placement{})
	f.createDeployment("d", v1alpha1.Placement{})
	hog := f.createReplica(replicaSpec{name: "hog-0", deployment: "hog", memory: 8, node: "a"})
	f.startScheduler()
	f.createReplica(replicaSpec{name: "d-0", deployment: "d", memory: 6})
	f.waitScheduled("d-0", metav1.ConditionFalse, string(ReasonInsufficientMemory))

	if err := f.c.Delete(t.Context(), hog); err != nil {
		t.Fatal(err)
	}
	if r := f.waitScheduled("d-0", metav1.ConditionTrue, v1alpha1.ReasonBound); r.Spec.NodeName != f.node("a") {
		t.Errorf("d-0 bound to %s, want %s", r.Spec.NodeName, f.node("a"))
	}
}

// TestBoundReplicaNeverMoves: once bound, a replica stays where it is when its node is
// cordoned or lost and a better node appears; the API server refuses a rebind.
func TestBoundReplicaNeverMoves(t *testing.T) {
	f := newFixture(t)
	sched := f.startScheduler()
	f.createNode(nodeSpec{name: "a", ceiling: 16})
	f.createDeployment("d", v1alpha1.Placement{MaxReplicasPerNode: 2})
	f.createReplica(replicaSpec{name: "d-0", deployment: "d", memory: 8})
	first := f.waitScheduled("d-0", metav1.ConditionTrue, v1alpha1.ReasonBound)

	f.patchNode("a", false, func(n *v1alpha1.MacNode) { n.Spec.Unschedulable = true })
	f.patchNode("a", true, func(n *v1alpha1.MacNode) { n.Status.Conditions[0].Status = metav1.ConditionUnknown })
	f.createNode(nodeSpec{name: "b", ceiling: 64})
	// A new replica proves the scheduler solved after all of that, once its cache has
	// it all (d-1 still fits on a, so a solve on an older fleet would put it there).
	f.waitCached(sched, []string{"a", "b"}, nil)
	f.createReplica(replicaSpec{name: "d-1", deployment: "d", memory: 8})
	if r := f.waitScheduled("d-1", metav1.ConditionTrue, v1alpha1.ReasonBound); r.Spec.NodeName != f.node("b") {
		t.Errorf("d-1 bound to %s, want %s", r.Spec.NodeName, f.node("b"))
	}

	now := f.replica("d-0")
	if now.Spec.NodeName != first.Spec.NodeName || now.Generation != first.Generation {
		t.Errorf("d-0 moved: nodeName %s → %s, generation %d → %d", first.Spec.NodeName, now.Spec.NodeName, first.Generation, now.Generation)
	}
	if n := len(f.events("d-0", EventScheduled)); n != 1 {
		t.Errorf("%d Scheduled Events for d-0, want 1", n)
	}

	before := now.DeepCopy()
	now.Spec.NodeName = f.node("b")
	err := f.c.Patch(t.Context(), now, client.MergeFrom(before))
	if err == nil || !strings.Contains(err.Error(), "nodeName is immutable") {
		t.Errorf("rebinding by hand: err = %v, want the immutability rule", err)
	}
}

// TestTwoSchedulersBindOnce runs two schedulers at once, as during a botched leader
// handover: every replica is still bound exactly once.
func TestTwoSchedulersBindOnce(t *testing.T) {
	const deployments, perDeployment = 6, 10
	f := newFixture(t)
	for i := range 4 {
		f.createNode(nodeSpec{name: fmt.Sprintf("mac-%d", i), ceiling: 1024})
	}
	for d := range deployments {
		f.createDeployment(fmt.Sprintf("d%d", d), v1alpha1.Placement{Strategy: v1alpha1.Spread, MaxReplicasPerNode: 64})
	}
	f.startScheduler()
	f.startScheduler()
	bindings0 := testutil.ToFloat64(bindingsTotal)

	var names []string
	for d := range deployments {
		for i := range perDeployment {
			name := fmt.Sprintf("d%d-%d", d, i)
			names = append(names, name)
			f.createReplica(replicaSpec{name: name, deployment: fmt.Sprintf("d%d", d), memory: 1})
		}
	}
	for _, name := range names {
		f.waitScheduled(name, metav1.ConditionTrue, v1alpha1.ReasonBound)
	}
	if got := testutil.ToFloat64(bindingsTotal) - bindings0; got != float64(len(names)) {
		t.Errorf("%v bindings written for %d replicas, want exactly one each", got, len(names))
	}
	for _, name := range names {
		f.waitEvent(name, EventScheduled, "Bound to "+f.replica(name).Spec.NodeName)
		if n := len(f.events(name, EventScheduled)); n != 1 {
			t.Errorf("%d Scheduled Events for %s, want 1", n, name)
		}
	}
}

// TestBurstCoalesces: replicas waiting when the scheduler starts are placed by a
// handful of solves, not one per replica. Counted are the solves that wrote: the
// scheduler's own bindings come back as watch events and each may trigger one more
// solve, which finds nothing to do; how many do depends on how loaded the machine is.
func TestBurstCoalesces(t *testing.T) {
	const nodes, deployments, perDeployment = 10, 20, 10
	f := newFixture(t)
	for i := range nodes {
		f.createNode(nodeSpec{name: fmt.Sprintf("mac-%d", i), ceiling: 64})
	}
	var names []string
	for d := range deployments {
		f.createDeployment(fmt.Sprintf("d%d", d), v1alpha1.Placement{Strategy: v1alpha1.Spread})
		for i := range perDeployment {
			name := fmt.Sprintf("d%d-%d", d, i)
			names = append(names, name)
			f.createReplica(replicaSpec{name: name, deployment: fmt.Sprintf("d%d", d), memory: 2})
		}
	}
	solves0 := histogramCount(t, solveDuration)
	var mu sync.Mutex
	writing := 0 // solves that wrote something
	writes := regexp.MustCompile(`"writes"=(\d+)`)
	f.startScheduler(func(o *ctrl.Options) {
		o.Logger = funcr.New(func(_, args string) {
			if m := writes.FindStringSubmatch(args); strings.Contains(args, `"msg"="Solved the fleet"`) && m != nil && m[1] != "0" {
				mu.Lock()
				writing++
				mu.Unlock()
			}
		}, funcr.Options{Verbosity: 2})
	})

	perNode := map[string]int{}
	for _, name := range names {
		r := f.waitScheduled(name, metav1.ConditionTrue, v1alpha1.ReasonBound)
		perNode[r.Spec.NodeName]++
	}
	solves := histogramCount(t, solveDuration) - solves0
	mu.Lock()
	wrote := writing
	mu.Unlock()
	t.Logf("%d replicas placed by %d solves (%d solves in all)", len(names), wrote, solves)
	if wrote == 0 || wrote > 10 {
		t.Errorf("%d solves wrote for %d replicas, want 1 to 10", wrote, len(names))
	}
	// Spread with one replica per Mac: every Mac runs one replica of each deployment.
	for node, n := range perNode {
		if n != deployments {
			t.Errorf("%s runs %d replicas, want %d", node, n, deployments)
		}
	}
	if sum := histogramSum(t, solveDuration); sum <= 0 {
		t.Errorf("%s sum = %v, want > 0", MetricSolveDuration, sum)
	}
}

// TestReconcileWithoutManager runs one pass by hand against the API server (no cache,
// a fake recorder): it binds, records the Event, and never asks to be requeued — the
// scheduler only runs again when something it watches changes.
func TestReconcileWithoutManager(t *testing.T) {
	f := newFixture(t)
	f.createNode(nodeSpec{name: "a", ceiling: 16})
	f.createDeployment("d", v1alpha1.Placement{})
	f.createReplica(replicaSpec{name: "d-0", deployment: "d", memory: 4})
	f.createReplica(replicaSpec{name: "d-1", deployment: "d", memory: 4})

	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: onlyNamespace{f.c, f.ns, runLabel}, Recorder: rec, Clock: clock.RealClock{}, Workers: 1}
	res, err := r.Reconcile(t.Context(), FleetRequest)
	if err != nil || res != (ctrl.Result{}) {
		t.Fatalf("Reconcile = %+v, %v; want a zero Result and no error", res, err)
	}
	bound := f.replica("d-0")
	if bound.Spec.NodeName != f.node("a") {
		t.Errorf("d-0 bound to %q, want %s", bound.Spec.NodeName, f.node("a"))
	}
	if c := meta.FindStatusCondition(f.replica("d-1").Status.Conditions, v1alpha1.ReplicaScheduled); c == nil || c.Reason != string(ReasonMaxReplicasPerNode) {
		t.Errorf("d-1 Scheduled = %+v, want reason %s", c, ReasonMaxReplicasPerNode)
	}
	var got []string
	for range 2 {
		got = append(got, <-rec.Events)
	}
	slices.Sort(got)
	want := []string{
		"Normal Scheduled Bound to " + f.node("a"),
		"Warning FailedScheduling 0/1 Macs fit: 1 already run this deployment (max 1 per Mac)",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}

	// A second pass over an unchanged fleet writes nothing.
	res, err = r.Reconcile(t.Context(), FleetRequest)
	if err != nil || res != (ctrl.Result{}) {
		t.Fatalf("second Reconcile = %+v, %v", res, err)
	}
	if again := f.replica("d-0"); again.ResourceVersion != bound.ResourceVersion {
		t.Errorf("second pass rewrote d-0: resourceVersion %s → %s", bound.ResourceVersion, again.ResourceVersion)
	}
	select {
	case e := <-rec.Events:
		t.Errorf("second pass emitted %q", e)
	default:
	}
}

// onlyNamespace is a client whose lists see one namespace and, for MacNodes, only
// those labelled for the test — what the envtest managers get from their cache.
type onlyNamespace struct {
	client.Client
	ns, label string
}

func (c onlyNamespace) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, nodes := list.(*v1alpha1.MacNodeList); nodes {
		return c.Client.List(ctx, list, append(opts, client.MatchingLabels{c.label: c.ns})...)
	}
	return c.Client.List(ctx, list, append(opts, client.InNamespace(c.ns))...)
}

// TestMetricsRegistered: the four metrics are served by the manager's registry.
func TestMetricsRegistered(t *testing.T) {
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range families {
		if strings.HasPrefix(mf.GetName(), "macfleet_scheduler_") {
			got = append(got, mf.GetName())
		}
	}
	want := []string{MetricBindingsTotal, MetricSchedulingLatency, MetricSolveDuration, MetricUnschedulableReplicas}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("registered scheduler metrics (-want +got):\n%s", diff)
	}
}

// TestStaleCache runs a pass on a view that lags the API server the way an informer
// cache does right after a binding: it shows a new replica but not the binding the
// previous pass wrote. The pass must neither bind that replica again nor place the
// new one into the memory the binding took.
func TestStaleCache(t *testing.T) {
	f := newFixture(t)
	f.createNode(nodeSpec{name: "a", ceiling: 10})
	f.createDeployment("x", v1alpha1.Placement{})
	f.createDeployment("y", v1alpha1.Placement{})
	unbound := f.createReplica(replicaSpec{name: "x-0", deployment: "x", memory: 6})

	lagging := &staleReplicas{onlyNamespace: onlyNamespace{f.c, f.ns, runLabel}}
	r := &Reconciler{Client: lagging, Recorder: events.NewFakeRecorder(10), Clock: clock.RealClock{}}
	if _, err := r.Reconcile(t.Context(), FleetRequest); err != nil {
		t.Fatal(err)
	}
	if got := f.replica("x-0").Spec.NodeName; got != f.node("a") {
		t.Fatalf("x-0 bound to %q, want %s", got, f.node("a"))
	}

	// y-0 is larger, so a solve that believed x-0 pending would place y-0 first, on a.
	f.createReplica(replicaSpec{name: "y-0", deployment: "y", memory: 7})
	lagging.stale = unbound
	if _, err := r.Reconcile(t.Context(), FleetRequest); err != nil {
		t.Errorf("pass on the lagging view: %v", err)
	}
	y := f.replica("y-0")
	c := meta.FindStatusCondition(y.Status.Conditions, v1alpha1.ReplicaScheduled)
	if y.Spec.NodeName != "" || c == nil || c.Reason != string(ReasonInsufficientMemory) {
		t.Errorf("y-0: nodeName %q, Scheduled %+v; want unbound, %s", y.Spec.NodeName, c, ReasonInsufficientMemory)
	}
	if x := f.replica("x-0"); x.Spec.NodeName != f.node("a") {
		t.Errorf("x-0 now bound to %q", x.Spec.NodeName)
	}
}

// staleReplicas lists like onlyNamespace but shows the stale copy of one replica in
// place of the current one.
type staleReplicas struct {
	onlyNamespace
	stale *v1alpha1.ModelReplica
}

func (c *staleReplicas) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.onlyNamespace.List(ctx, list, opts...); err != nil {
		return err
	}
	if l, ok := list.(*v1alpha1.ModelReplicaList); ok && c.stale != nil {
		for i := range l.Items {
			if l.Items[i].UID == c.stale.UID {
				l.Items[i] = *c.stale.DeepCopy()
			}
		}
	}
	return nil
}

package scheduler

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The envtest suites start one API server for the package, on first use, so that the
// solver's pure tests and benchmark run without one.
var (
	envOnce sync.Once
	env     *testenv.Env
	envErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if env != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

func apiServer(tb testing.TB) *testenv.Env {
	tb.Helper()
	envOnce.Do(func() { env, envErr = testenv.New(testenv.WithScheme(v1alpha1.AddToScheme)) })
	if envErr != nil {
		tb.Fatal(envErr)
	}
	return env
}

// runLabel marks the MacNodes of one test; the test's scheduler caches only those,
// and only the replicas and deployments of the test's namespace, so tests sharing the
// API server cannot see each other's fleet.
const runLabel = "scheduler-test.macfleet.dev/run"

const (
	wait = 30 * time.Second
	poll = 20 * time.Millisecond
)

// fixture is one test's namespace and fleet. It plays the deployment controller (it
// creates replicas) and the agents (it writes MacNode status).
type fixture struct {
	t  *testing.T
	c  client.Client
	ns string
}

func newFixture(t *testing.T) *fixture {
	e := apiServer(t)
	return &fixture{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
}

// startScheduler runs a manager with a scheduler Reconciler until the test ends;
// opts adjust the manager's options.
func (f *fixture) startScheduler(opts ...func(*ctrl.Options)) *Reconciler {
	f.t.Helper()
	e := apiServer(f.t)
	mopts := ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{f.ns: {}},
			ByObject: map[client.Object]cache.ByObject{
				&v1alpha1.MacNode{}: {Label: labels.SelectorFromSet(labels.Set{runLabel: f.ns})},
			},
		},
	}
	for _, o := range opts {
		o(&mopts)
	}
	mgr, err := ctrl.NewManager(e.Config, mopts)
	if err != nil {
		f.t.Fatalf("creating a manager: %v", err)
	}
	r := &Reconciler{}
	if err := r.SetupWithManager(mgr); err != nil {
		f.t.Fatalf("setting up the scheduler: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	f.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Errorf("manager: %v", err)
		}
	})
	return r
}

// waitCached waits until the scheduler's cache holds the API server's current version
// of each MacNode (by short name) and ModelDeployment. The cache's informers are
// independent, one per kind: without this, the event of a replica created next may
// trigger a solve that still sees an older fleet.
func (f *fixture) waitCached(r *Reconciler, nodes []string, deployments []string) {
	f.t.Helper()
	var objs []client.Object
	for _, n := range nodes {
		objs = append(objs, &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: f.node(n)}})
	}
	for _, d := range deployments {
		objs = append(objs, &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Name: d, Namespace: f.ns}})
	}
	for _, obj := range objs {
		key := client.ObjectKeyFromObject(obj)
		if err := f.c.Get(f.t.Context(), key, obj); err != nil {
			f.t.Fatalf("getting %T %s: %v", obj, key, err)
		}
		want := obj.GetResourceVersion()
		testenv.Eventually(f.t, wait, poll, func() (bool, string) {
			if err := r.Client.Get(f.t.Context(), key, obj); err != nil {
				return false, fmt.Sprintf("the scheduler's cache: %T %s: %v", obj, key, err)
			}
			return obj.GetResourceVersion() == want, fmt.Sprintf("the scheduler's cache has %T %s at resourceVersion %s, want %s",
				obj, key, obj.GetResourceVersion(), want)
		})
	}
}

// node is the cluster-wide name of the test's node called short.
func (f *fixture) node(short string) string { return f.ns + "-" + short }

// short strips the test's prefix from a node name.
func (f *fixture) short(node string) string { return strings.TrimPrefix(node, f.ns+"-") }

type nodeSpec struct {
	name        string
	ceiling     float64 // GiB reported by the agent; 0: none yet
	specCeiling float64 // GiB, spec.memoryCeiling; 0: unset
	agentMiB    int64   // MiB the agent reports using itself; 0: none
	labels      map[string]string
	cordoned    bool
	notReady    bool
}

// createNode creates a MacNode and writes its status as its agent would.
func (f *fixture) createNode(s nodeSpec) *v1alpha1.MacNode {
	f.t.Helper()
	n := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: f.node(s.name), Labels: map[string]string{runLabel: f.ns}}}
	for k, v := range s.labels {
		n.Labels[k] = v
	}
	n.Spec.Unschedulable = s.cordoned
	if s.specCeiling > 0 {
		n.Spec.MemoryCeiling = qty(s.specCeiling)
	}
	if err := f.c.Create(f.t.Context(), n); err != nil {
		f.t.Fatalf("creating MacNode %s: %v", n.Name, err)
	}
	f.t.Cleanup(func() {
		if err := f.c.Delete(context.Background(), n); err != nil {
			f.t.Errorf("deleting MacNode %s: %v", n.Name, err)
		}
	})
	ready := metav1.ConditionTrue
	if s.notReady {
		ready = metav1.ConditionFalse
	}
	if s.ceiling > 0 {
		n.Status.Memory.Ceiling = qty(s.ceiling)
	}
	if s.agentMiB > 0 {
		n.Status.Memory.Agent = resource.NewQuantity(s.agentMiB<<20, resource.BinarySI)
	}
	n.Status.Conditions = []metav1.Condition{{
		Type: v1alpha1.MacNodeReady, Status: ready, Reason: v1alpha1.ReasonAgentReady, LastTransitionTime: metav1.Now(),
	}}
	if err := f.c.Status().Update(f.t.Context(), n); err != nil {
		f.t.Fatalf("writing the status of MacNode %s: %v", n.Name, err)
	}
	return n
}

// patchNode changes a MacNode (spec and labels when status is false, else status).
func (f *fixture) patchNode(short string, status bool, change func(*v1alpha1.MacNode)) {
	f.t.Helper()
	var n v1alpha1.MacNode
	if err := f.c.Get(f.t.Context(), types.NamespacedName{Name: f.node(short)}, &n); err != nil {
		f.t.Fatal(err)
	}
	before := n.DeepCopy()
	change(&n)
	var err error
	if status {
		err = f.c.Status().Patch(f.t.Context(), &n, client.MergeFrom(before))
	} else {
		err = f.c.Patch(f.t.Context(), &n, client.MergeFrom(before))
	}
	if err != nil {
		f.t.Fatalf("patching MacNode %s: %v", n.Name, err)
	}
}

func (f *fixture) createDeployment(name string, placement v1alpha1.Placement) *v1alpha1.ModelDeployment {
	f.t.Helper()
	d := &v1alpha1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
		Spec: v1alpha1.ModelDeploymentSpec{
			Model:     v1alpha1.ModelSource{Source: "hf://org/repo/" + name + ".gguf"},
			Placement: placement,
		},
	}
	if err := f.c.Create(f.t.Context(), d); err != nil {
		f.t.Fatalf("creating ModelDeployment %s: %v", name, err)
	}
	return d
}

type replicaSpec struct {
	name, deployment string
	memory           float64 // GiB
	residency        v1alpha1.Residency
	node             string // short node name to create it bound to
}

// createReplica creates a ModelReplica as the deployment controller would: labelled,
// and owned by its deployment when that exists.
func (f *fixture) createReplica(s replicaSpec) *v1alpha1.ModelReplica {
	f.t.Helper()
	r := newReplica(f.ns, s)
	if s.node != "" {
		r.Spec.NodeName = f.node(s.node)
	}
	var d v1alpha1.ModelDeployment
	if err := f.c.Get(f.t.Context(), types.NamespacedName{Namespace: f.ns, Name: s.deployment}, &d); err == nil {
		r.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(&d, v1alpha1.GroupVersion.WithKind("ModelDeployment"))}
	}
	if err := f.c.Create(f.t.Context(), r); err != nil {
		f.t.Fatalf("creating ModelReplica %s: %v", s.name, err)
	}
	return r
}

func newReplica(ns string, s replicaSpec) *v1alpha1.ModelReplica {
	res := s.residency
	if res == "" {
		res = v1alpha1.ResidencyResident
	}
	return &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.name, Namespace: ns,
			Labels: map[string]string{v1alpha1.LabelDeployment: s.deployment, v1alpha1.LabelTemplateHash: "h1"},
		},
		Spec: v1alpha1.ModelReplicaSpec{
			Template: v1alpha1.ModelReplicaTemplate{
				Model:     v1alpha1.ModelSource{Source: "hf://org/repo/" + s.deployment + ".gguf"},
				Residency: res,
			},
			TemplateHash:      "h1",
			MemoryReservation: *qty(s.memory),
		},
	}
}

func (f *fixture) replica(name string) *v1alpha1.ModelReplica {
	f.t.Helper()
	var r v1alpha1.ModelReplica
	if err := f.c.Get(f.t.Context(), types.NamespacedName{Namespace: f.ns, Name: name}, &r); err != nil {
		f.t.Fatalf("getting ModelReplica %s: %v", name, err)
	}
	return &r
}

// waitScheduled waits until the replica's Scheduled condition has status and reason
// (and, for a bound replica, its nodeName is set), and returns the replica.
func (f *fixture) waitScheduled(name string, status metav1.ConditionStatus, reason string) *v1alpha1.ModelReplica {
	f.t.Helper()
	var r *v1alpha1.ModelReplica
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		r = f.replica(name)
		c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled)
		if c == nil || c.Status != status || c.Reason != reason || (status == metav1.ConditionTrue && r.Spec.NodeName == "") {
			return false, fmt.Sprintf("replica %s: nodeName %q, Scheduled %+v; want %s/%s", name, r.Spec.NodeName, c, status, reason)
		}
		return true, ""
	})
	return r
}

// events returns the notes of the Events about the replica with the given reason.
func (f *fixture) events(replica, reason string) []string {
	f.t.Helper()
	var list eventsv1.EventList
	if err := f.c.List(f.t.Context(), &list, client.InNamespace(f.ns)); err != nil {
		f.t.Fatalf("listing Events: %v", err)
	}
	var notes []string
	for _, e := range list.Items {
		if e.Regarding.Name == replica && e.Reason == reason {
			notes = append(notes, e.Note)
		}
	}
	return notes
}

// waitEvent waits until an Event with the reason and note exists about the replica.
func (f *fixture) waitEvent(replica, reason, note string) {
	f.t.Helper()
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		notes := f.events(replica, reason)
		for _, n := range notes {
			if n == note {
				return true, ""
			}
		}
		return false, fmt.Sprintf("Events %s about %s: %q, want one with note %q", reason, replica, notes, note)
	})
}

// histogramCount is the number of observations in h.
func histogramCount(tb testing.TB, h prometheus.Histogram) uint64 {
	tb.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		tb.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

func histogramSum(tb testing.TB, h prometheus.Histogram) float64 {
	tb.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		tb.Fatal(err)
	}
	return m.GetHistogram().GetSampleSum()
}

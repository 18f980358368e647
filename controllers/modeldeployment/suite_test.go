package modeldeployment

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// One API server for the package, started on first use, so that the pure tests run
// without one.
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
	envOnce.Do(func() {
		if env, envErr = testenv.New(testenv.WithScheme(v1alpha1.AddToScheme)); envErr == nil {
			envErr = env.Client.Create(context.Background(), testSourcePolicy())
		}
	})
	if envErr != nil {
		tb.Fatal(envErr)
	}
	return env
}

// testSourcePolicy lets every namespace use the sources the tests name: the
// registries, the loopback test servers and models.example over plain HTTP, and files
// under /Users/shared/models; fetches may connect to loopback.
func testSourcePolicy() *v1alpha1.SourcePolicy {
	return &v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SourcePolicyName},
		Spec: v1alpha1.SourcePolicySpec{
			Rules: []v1alpha1.SourcePolicyRule{{Namespaces: []string{"*"},
				Registries:      []v1alpha1.SourceRegistry{v1alpha1.RegistryHF, v1alpha1.RegistryOllama},
				Hosts:           []string{"127.0.0.1", "localhost", "models.example"},
				AllowPlainHTTP:  true,
				FileDirectories: []string{"/Users/shared/models"}}},
			AllowedNetworks: []string{"127.0.0.0/8", "::1/128"},
		}}
}

const (
	wait = 30 * time.Second
	poll = 20 * time.Millisecond
)

// fixture is one test's namespace, with a client for it.
type fixture struct {
	t  *testing.T
	c  client.Client
	ns string
}

func newFixture(t *testing.T) *fixture {
	e := apiServer(t)
	return &fixture{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
}

// start runs a manager with r, caching only the test's namespace, until the test ends.
func (f *fixture) start(r *Reconciler) {
	f.t.Helper()
	f.startManager(cache.Options{}, func(mgr ctrl.Manager) error {
		return r.setup(mgr, controller.Options{SkipNameValidation: ptr.To(true)})
	})
}

// startManager runs a manager set up by setup until the test ends; its cache holds
// the test's namespace and what opts adds.
func (f *fixture) startManager(opts cache.Options, setup func(ctrl.Manager) error) {
	f.t.Helper()
	e := apiServer(f.t)
	cfg := rest.CopyConfig(e.Config)
	cfg.QPS = -1 // no client-side rate limit: the tests measure the controller
	opts.DefaultNamespaces = map[string]cache.Config{f.ns: {}}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Cache:                  opts,
	})
	if err != nil {
		f.t.Fatalf("creating a manager: %v", err)
	}
	if err := setup(mgr); err != nil {
		f.t.Fatalf("setting up the controller: %v", err)
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
}

func (f *fixture) create(md *v1alpha1.ModelDeployment) *v1alpha1.ModelDeployment {
	f.t.Helper()
	md.Namespace = f.ns
	if err := f.c.Create(f.t.Context(), md); err != nil {
		f.t.Fatalf("creating deployment %s: %v", md.Name, err)
	}
	return md
}

func (f *fixture) deployment(name string) *v1alpha1.ModelDeployment {
	f.t.Helper()
	md := &v1alpha1.ModelDeployment{}
	if err := f.c.Get(f.t.Context(), types.NamespacedName{Namespace: f.ns, Name: name}, md); err != nil {
		f.t.Fatalf("getting deployment %s: %v", name, err)
	}
	return md
}

// update changes a deployment's spec, retrying on conflicts.
func (f *fixture) update(name string, mutate func(*v1alpha1.ModelDeployment)) {
	f.t.Helper()
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		md := f.deployment(name)
		mutate(md)
		if err := f.c.Update(f.t.Context(), md); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// replicas lists the namespace's replicas (from the API server), oldest first.
func (f *fixture) replicas() []v1alpha1.ModelReplica {
	f.t.Helper()
	var list v1alpha1.ModelReplicaList
	if err := f.c.List(f.t.Context(), &list, client.InNamespace(f.ns)); err != nil {
		f.t.Fatalf("listing replicas: %v", err)
	}
	slices.SortFunc(list.Items, func(a, b v1alpha1.ModelReplica) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return list.Items
}

// waitReplicas waits until the namespace holds n replicas and returns them.
func (f *fixture) waitReplicas(n int) []v1alpha1.ModelReplica {
	f.t.Helper()
	var reps []v1alpha1.ModelReplica
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		reps = f.replicas()
		return len(reps) == n, fmt.Sprintf("%d replicas, want %d: %v", len(reps), n, names(reps))
	})
	return reps
}

// waitStatus waits until cond holds for the deployment's status.
func (f *fixture) waitStatus(name string, cond func(*v1alpha1.ModelDeployment) (bool, string)) *v1alpha1.ModelDeployment {
	f.t.Helper()
	var md *v1alpha1.ModelDeployment
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		md = f.deployment(name)
		return cond(md)
	})
	return md
}

// bind plays the scheduler: it sets the replica's nodeName.
func (f *fixture) bind(mr *v1alpha1.ModelReplica, node string) {
	f.t.Helper()
	if err := f.tryBind(mr, node); err != nil {
		f.t.Fatalf("binding %s: %v", mr.Name, err)
	}
}

func (f *fixture) tryBind(mr *v1alpha1.ModelReplica, node string) error {
	before := mr.DeepCopy()
	mr.Spec.NodeName = node
	return f.c.Patch(context.Background(), mr, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

// markReady plays the agent: it sets the replica's Ready condition (and, when peak is
// positive, its measured peak footprint).
func (f *fixture) markReady(mr *v1alpha1.ModelReplica) {
	f.t.Helper()
	if err := f.tryMarkReady(mr); err != nil {
		f.t.Fatalf("marking %s ready: %v", mr.Name, err)
	}
}

func (f *fixture) tryMarkReady(mr *v1alpha1.ModelReplica) error {
	before := mr.DeepCopy()
	meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ReplicaReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonRunnerReady, Message: "serving",
	})
	return f.c.Status().Patch(context.Background(), mr, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

// setUnschedulable plays the scheduler failing to place a replica.
func (f *fixture) setUnschedulable(mr *v1alpha1.ModelReplica, msg string) {
	f.t.Helper()
	before := mr.DeepCopy()
	meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ReplicaScheduled, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonUnschedulable, Message: msg,
	})
	if err := f.c.Status().Patch(f.t.Context(), mr, client.MergeFrom(before)); err != nil {
		f.t.Fatalf("marking %s unschedulable: %v", mr.Name, err)
	}
}

// runAgents plays scheduler and agents until the test ends: every unbound replica is
// bound to a node of its own and marked Ready.
func (f *fixture) runAgents() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n := 0
		tick := time.NewTicker(poll)
		defer tick.Stop()
		for {
			var list v1alpha1.ModelReplicaList
			if err := f.c.List(ctx, &list, client.InNamespace(f.ns)); err == nil {
				for i := range list.Items {
					mr := &list.Items[i]
					if mr.DeletionTimestamp != nil {
						continue
					}
					if mr.Spec.NodeName == "" {
						n++
						if f.tryBind(mr, fmt.Sprintf("mac-%d", n)) != nil {
							continue
						}
					}
					if !isReady(mr) {
						_ = f.tryMarkReady(mr)
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	f.t.Cleanup(func() { cancel(); <-done })
}

func names(reps []v1alpha1.ModelReplica) []string {
	var ns []string
	for _, r := range reps {
		ns = append(ns, r.Name)
	}
	return ns
}

func condition(md *v1alpha1.ModelDeployment, typ string) string {
	c := meta.FindStatusCondition(md.Status.Conditions, typ)
	if c == nil {
		return "<none>"
	}
	return fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message)
}

package autoscaler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// One API server for the package, started on first use, so that the pure tests run
// without one.
var shared = testenv.NewLazy(testenv.WithScheme(v1alpha1.AddToScheme))

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.ConsoleEncoder()))
	os.Exit(shared.Run(m))
}

func apiServer(tb testing.TB) *testenv.Env {
	tb.Helper()
	return shared.Get(tb)
}

const (
	wait = 30 * time.Second
	poll = 10 * time.Millisecond
)

// fakeSource is a LoadSource the test sets, counting measurements.
type fakeSource struct {
	mu    sync.Mutex
	load  map[string]Load
	err   error
	calls map[string]int
}

func newFakeSource() *fakeSource {
	return &fakeSource{load: map[string]Load{}, calls: map[string]int{}}
}

func (s *fakeSource) Measure(_ context.Context, md *v1alpha1.ModelDeployment) (Load, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[md.Name]++
	return s.load[md.Name], s.err
}

func (s *fakeSource) set(name string, l Load, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.load[name], s.err = l, err
}

func (s *fakeSource) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[name]
}

// fixture is one test's namespace, a manager running the autoscaler on a fake clock
// and a fake load source.
type fixture struct {
	t   *testing.T
	e   *testenv.Env
	ns  string
	clk *clocktesting.FakeClock
	src *fakeSource
}

var t0Controller = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func start(t *testing.T) *fixture {
	e := apiServer(t)
	f := &fixture{t: t, e: e, ns: testenv.NewNamespace(t, e.Client), clk: clocktesting.NewFakeClock(t0Controller), src: newFakeSource()}
	cfg := rest.CopyConfig(e.Config)
	cfg.QPS = -1
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{f.ns: {}}},
	})
	if err != nil {
		t.Fatalf("creating a manager: %v", err)
	}
	// Measurements every 20ms of real time; the windows are on the fake clock, which
	// only the test moves (by up to 10s a step, within StaleAfter).
	r := &Reconciler{Source: f.src, Clock: f.clk, Interval: 20 * time.Millisecond, StaleAfter: 30 * time.Second}
	if err := r.setup(mgr, controller.Options{SkipNameValidation: ptr.To(true)}); err != nil {
		t.Fatalf("setting up the autoscaler: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("manager: %v", err)
		}
	})
	return f
}

func (f *fixture) create(md *v1alpha1.ModelDeployment) {
	f.t.Helper()
	md.Namespace = f.ns
	if err := f.e.Client.Create(f.t.Context(), md); err != nil {
		f.t.Fatalf("creating %s: %v", md.Name, err)
	}
}

func (f *fixture) get(name string) *v1alpha1.ModelDeployment {
	f.t.Helper()
	md := &v1alpha1.ModelDeployment{}
	if err := f.e.Client.Get(f.t.Context(), types.NamespacedName{Namespace: f.ns, Name: name}, md); err != nil {
		f.t.Fatalf("getting %s: %v", name, err)
	}
	return md
}

// tick sets the load, moves the fake clock by d and waits for two measurements after
// the step, so that at least one whole pass ran at the new time.
func (f *fixture) tick(name string, d time.Duration, l Load) {
	f.t.Helper()
	f.src.set(name, l, nil)
	f.clk.Step(d)
	n := f.src.count(name)
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		c := f.src.count(name)
		return c >= n+2, fmt.Sprintf("%d measurements of %s since the step, want 2", c-n, name)
	})
}

// waitFor waits until the deployment has replicas replicas and an Autoscaling
// condition with the reason and message, and returns it.
func (f *fixture) waitFor(name string, replicas int32, reason, message string) *v1alpha1.ModelDeployment {
	f.t.Helper()
	var md *v1alpha1.ModelDeployment
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		md = f.get(name)
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentAutoscaling)
		got := ptr.Deref(md.Spec.Replicas, -1)
		if c == nil {
			return false, fmt.Sprintf("replicas %d, no Autoscaling condition", got)
		}
		ok := got == replicas && c.Reason == reason && (message == "" || strings.Contains(c.Message, message))
		return ok, fmt.Sprintf("replicas %d, condition %s %s %q; want %d, %s with %q", got, c.Status, c.Reason, c.Message,
			replicas, reason, message)
	})
	return md
}

package macnode

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.ConsoleEncoder()))
	testenv.Main(m, &env, testenv.WithScheme(v1alpha1.AddToScheme))
}

const (
	leaseSeconds = 40
	grace        = 60 * time.Second
	wait         = 20 * time.Second // real time allowed for the controller to react
	poll         = 20 * time.Millisecond
)

// pass is one Reconcile the test observed.
type pass struct {
	at  time.Time // the fake clock when it started
	res ctrl.Result
	err error
}

// observer records every Reconcile of a controller by node name, so that a test can
// wait for a pass that saw a given time before asserting that something did NOT
// happen.
type observer struct {
	clk      *clocktesting.FakeClock
	mu       sync.Mutex
	passes   map[string][]pass
	requeues map[string][]time.Time // when each RequeueAfter becomes ready
}

// reset forgets what an earlier controller did.
func (o *observer) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.passes, o.requeues = map[string][]pass{}, map[string][]time.Time{}
}

func (o *observer) hooks() hooks {
	return hooks{wrap: o.wrap, requeued: func(req reconcile.Request, readyAt time.Time) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.requeues[req.Name] = append(o.requeues[req.Name], readyAt)
	}}
}

// waitRequeue waits until the controller has asked to look at node again at
// readyAt, so that stepping the fake clock to it cannot miss that requeue.
func (o *observer) waitRequeue(t *testing.T, node string, readyAt time.Time) {
	t.Helper()
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, at := range o.requeues[node] {
			if at.Equal(readyAt) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no requeue of %s at %s; requeues: %v", node, readyAt, o.requeues[node])
	})
}

func (o *observer) wrap(r reconcile.Reconciler) reconcile.Reconciler {
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		at := o.clk.Now()
		res, err := r.Reconcile(ctx, req)
		o.mu.Lock()
		defer o.mu.Unlock()
		o.passes[req.Name] = append(o.passes[req.Name], pass{at: at, res: res, err: err})
		return res, err
	})
}

// waitPass waits for a successful pass over node that started at or after since,
// and returns it.
func (o *observer) waitPass(t *testing.T, node string, since time.Time) pass {
	t.Helper()
	var found pass
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, p := range o.passes[node] {
			if p.err == nil && !p.at.Before(since) {
				found = p
				return true, ""
			}
		}
		return false, fmt.Sprintf("no successful pass over %s at or after %s; passes: %+v", node, since, o.passes[node])
	})
	return found
}

// fixture is one test's controller, fake clock and objects.
type fixture struct {
	t      *testing.T
	c      client.Client
	clk    *clocktesting.FakeClock
	obs    *observer
	ns     string
	prefix string
	stop   func()
	// contact is the Reconciler's Contact (nil: none).
	contact interface{ Since(time.Time) time.Time }
}

func newFixture(t *testing.T) *fixture { return newFixtureWith(t, nil) }

func newFixtureWith(t *testing.T, contact interface{ Since(time.Time) time.Time }) *fixture {
	ns := testenv.NewNamespace(t, env.Client)
	leaseNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.NodeLeaseNamespace}}
	if err := env.Client.Create(t.Context(), leaseNS); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// Whole seconds: lastTransitionTime is stored with second precision.
	clk := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	f := &fixture{t: t, c: env.Client, clk: clk, obs: &observer{clk: clk}, ns: ns, prefix: ns, contact: contact}
	f.start()
	t.Cleanup(func() { f.stop() })
	return f
}

// start runs a manager with the controller until stop is called.
func (f *fixture) start() {
	f.t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{ByObject: CacheByObject()},
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	r := &Reconciler{Clock: f.clk, NodeLossGrace: grace, Contact: f.contact}
	f.obs.reset()
	if err := r.setup(mgr, f.obs.hooks()); err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	f.stop = func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Errorf("manager: %v", err)
		}
		f.stop = func() {}
	}
}

// node plays an agent starting: it renews the node's Lease for leaseFor (none if
// zero), creates the MacNode and reports Ready=True (only with a Lease).
func (f *fixture) node(suffix string, unschedulable bool, leaseFor time.Duration) string {
	f.t.Helper()
	n := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: f.prefix + "-" + suffix}, Spec: v1alpha1.MacNodeSpec{Unschedulable: unschedulable}}
	f.t.Cleanup(func() {
		_ = f.c.Delete(context.Background(), n)
		_ = f.c.Delete(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.NodeLeaseNamespace, Name: n.Name}})
	})
	if leaseFor > 0 {
		f.renewFor(n.Name, leaseFor)
	}
	if err := f.c.Create(f.t.Context(), n); err != nil {
		f.t.Fatal(err)
	}
	if leaseFor > 0 {
		f.setReady(n.Name)
	}
	return n.Name
}

// setReady plays the agent reporting Ready=True.
func (f *fixture) setReady(name string) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n v1alpha1.MacNode
		if err := f.c.Get(f.t.Context(), types.NamespacedName{Name: name}, &n); err != nil {
			return err
		}
		meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: v1alpha1.MacNodeReady, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonAgentReady, Message: "test agent", LastTransitionTime: metav1.NewTime(f.clk.Now())})
		n.Status.Agent.Address = "10.0.0.1:8080"
		return f.c.Status().Update(f.t.Context(), &n)
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// renew plays the agent renewing the node's Lease at the fake clock's now for
// leaseSeconds.
func (f *fixture) renew(name string) { f.renewFor(name, leaseSeconds*time.Second) }

func (f *fixture) renewFor(name string, d time.Duration) {
	f.t.Helper()
	key := types.NamespacedName{Namespace: v1alpha1.NodeLeaseNamespace, Name: name}
	var l coordinationv1.Lease
	err := f.c.Get(f.t.Context(), key, &l)
	l.Name, l.Namespace = key.Name, key.Namespace
	l.Spec.HolderIdentity = ptr.To(name)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(d / time.Second))
	l.Spec.RenewTime = &metav1.MicroTime{Time: f.clk.Now()}
	switch {
	case apierrors.IsNotFound(err):
		err = f.c.Create(f.t.Context(), &l)
	case err == nil:
		err = f.c.Update(f.t.Context(), &l)
	}
	if err != nil {
		f.t.Fatal(err)
	}
}

// touch changes a label on the node, which makes the controller look at it again.
func (f *fixture) touch(name string) {
	f.t.Helper()
	n := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{"test/touched":"%d"}}}`, f.clk.Now().Unix())
	if err := f.c.Patch(f.t.Context(), n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		f.t.Fatal(err)
	}
}

// replica creates a ModelReplica bound to nodeName ("" for unbound) in ns.
func (f *fixture) replica(ns, name, nodeName string) *v1alpha1.ModelReplica {
	f.t.Helper()
	mr := &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.LabelDeployment: "d"}},
		Spec: v1alpha1.ModelReplicaSpec{
			Template:          v1alpha1.ModelReplicaTemplate{Model: v1alpha1.ModelSource{Source: "hf://org/repo/model.gguf"}},
			TemplateHash:      "h1",
			MemoryReservation: resource.MustParse("1Gi"),
			NodeName:          nodeName,
		},
	}
	if err := f.c.Create(f.t.Context(), mr); err != nil {
		f.t.Fatal(err)
	}
	return mr
}

// replicaReady plays the replica's agent reporting Ready=True.
func (f *fixture) replicaReady(mr *v1alpha1.ModelReplica) {
	f.t.Helper()
	before := mr.DeepCopy()
	meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{Type: v1alpha1.ReplicaReady,
		Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonRunnerReady, Message: "serving"})
	if err := f.c.Status().Patch(f.t.Context(), mr, client.MergeFrom(before)); err != nil {
		f.t.Fatal(err)
	}
}

// replicaCondition is the replica's Ready condition as the API server has it.
func (f *fixture) replicaCondition(mr *v1alpha1.ModelReplica) *metav1.Condition {
	f.t.Helper()
	var cur v1alpha1.ModelReplica
	if err := f.c.Get(f.t.Context(), client.ObjectKeyFromObject(mr), &cur); err != nil {
		f.t.Fatal(err)
	}
	return meta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ReplicaReady)
}

// replicas returns the names of the replicas that still exist (and are not being
// deleted) among mrs.
func (f *fixture) replicas(mrs ...*v1alpha1.ModelReplica) []string {
	f.t.Helper()
	var names []string
	for _, mr := range mrs {
		var got v1alpha1.ModelReplica
		err := f.c.Get(f.t.Context(), client.ObjectKeyFromObject(mr), &got)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			f.t.Fatal(err)
		case got.DeletionTimestamp == nil:
			names = append(names, got.Name)
		}
	}
	return names
}

func (f *fixture) ready(name string) metav1.Condition {
	f.t.Helper()
	var n v1alpha1.MacNode
	if err := f.c.Get(f.t.Context(), types.NamespacedName{Name: name}, &n); err != nil {
		f.t.Fatal(err)
	}
	c := meta.FindStatusCondition(n.Status.Conditions, v1alpha1.MacNodeReady)
	if c == nil {
		return metav1.Condition{}
	}
	return *c
}

// waitUnknown waits for Ready=Unknown with reason NodeLeaseExpired and returns it.
func (f *fixture) waitUnknown(name string) metav1.Condition {
	f.t.Helper()
	var c metav1.Condition
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		c = f.ready(name)
		return c.Status == metav1.ConditionUnknown && c.Reason == v1alpha1.ReasonLeaseExpired, fmt.Sprintf("Ready of %s is %+v", name, c)
	})
	return c
}

func (f *fixture) waitReplicas(want []string, mrs ...*v1alpha1.ModelReplica) {
	f.t.Helper()
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		got := f.replicas(mrs...)
		return cmp.Equal(want, got), fmt.Sprintf("replicas (-want +got):\n%s", cmp.Diff(want, got))
	})
}

// TestLiveNodeKeepsReplicas: a node whose agent keeps renewing its Lease stays
// Ready and keeps its replicas well past the Lease duration and the grace period,
// cordoned or not (cordon is not drain).
func TestLiveNodeKeepsReplicas(t *testing.T) {
	for _, cordoned := range []bool{false, true} {
		t.Run(fmt.Sprintf("cordoned=%v", cordoned), func(t *testing.T) {
			f := newFixture(t)
			start := f.clk.Now()
			n := f.node("mac", cordoned, leaseSeconds*time.Second)
			mr := f.replica(f.ns, "r1", n)
			for now := start; now.Sub(start) < 3*grace; {
				f.obs.waitRequeue(t, n, now.Add(leaseSeconds*time.Second))
				f.clk.Step(leaseSeconds * time.Second * 3 / 4)
				now = f.clk.Now()
				f.renew(n)
				f.obs.waitPass(t, n, now)
				if c := f.ready(n); c.Status != metav1.ConditionTrue {
					t.Fatalf("at %s: Ready is %+v, want the agent's True", now.Sub(start), c)
				}
			}
			if diff := cmp.Diff([]string{"r1"}, f.replicas(mr)); diff != "" {
				t.Errorf("replicas (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLeaseExpiry: an expired Lease turns Ready Unknown as soon as it expires (by
// the requeue alone); a missing Lease too; after the grace period the node's bound
// replicas are deleted in every namespace with an Event, while unbound replicas and
// other nodes' replicas stay; a replica bound to the lost node later is deleted too.
func TestLeaseExpiry(t *testing.T) {
	f := newFixture(t)
	ns2 := testenv.NewNamespace(t, env.Client)
	start := f.clk.Now()
	lost := f.node("lost", false, leaseSeconds*time.Second)
	alive := f.node("alive", false, time.Hour)
	never := f.node("never", false, 0)
	a1, a2 := f.replica(f.ns, "a1", lost), f.replica(ns2, "a2", lost)
	unbound, b1 := f.replica(f.ns, "unbound", ""), f.replica(f.ns, "b1", alive)
	all := []*v1alpha1.ModelReplica{a1, a2, unbound, b1}
	// Their agents said they serve.
	f.replicaReady(a1)
	f.replicaReady(b1)

	if c := f.waitUnknown(never); c.Message != fmt.Sprintf("Lease macfleet-node-lease/%s does not exist: the agent has not started or cannot reach the API server", never) {
		t.Errorf("Ready message of a node without a Lease: %q", c.Message)
	}

	expiry := start.Add(leaseSeconds * time.Second)
	f.obs.waitRequeue(t, lost, expiry)
	f.clk.Step(leaseSeconds * time.Second)
	c := f.waitUnknown(lost)
	if !c.LastTransitionTime.Time.Equal(expiry) {
		t.Errorf("Ready turned Unknown at %s, want the Lease's expiry %s", c.LastTransitionTime, expiry)
	}
	if c := f.ready(alive); c.Status != metav1.ConditionTrue {
		t.Errorf("the live node's Ready is %+v", c)
	}
	// The Ready gauge follows: 0 for the lost node, 1 for the live one.
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		l, a := testutil.ToFloat64(readyGauge.WithLabelValues(lost)), testutil.ToFloat64(readyGauge.WithLabelValues(alive))
		return l == 0 && a == 1, fmt.Sprintf("%s{macnode=%q} = %v, {macnode=%q} = %v", MetricReady, lost, l, alive, a)
	})
	// The lost node's replica no longer counts as ready; the live node's does.
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		c := f.replicaCondition(a1)
		return c != nil && c.Status == metav1.ConditionUnknown && c.Reason == v1alpha1.ReasonNodeUnreachable,
			fmt.Sprintf("replica a1 on the lost node: Ready %+v", c)
	})
	if c := f.replicaCondition(b1); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("replica b1 on the live node: Ready %+v", c)
	}

	// Just before the end of the grace period nothing is deleted.
	f.obs.waitRequeue(t, lost, expiry.Add(grace))
	f.clk.Step(grace - time.Second)
	f.touch(lost)
	if p := f.obs.waitPass(t, lost, f.clk.Now()); p.res.RequeueAfter != time.Second {
		t.Errorf("in grace: requeue after %s, want 1s", p.res.RequeueAfter)
	}
	if diff := cmp.Diff([]string{"a1", "a2", "unbound", "b1"}, f.replicas(all...)); diff != "" {
		t.Errorf("replicas before the grace period ended (-want +got):\n%s", diff)
	}

	f.clk.Step(time.Second)
	f.waitReplicas([]string{"unbound", "b1"}, all...)
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		var list eventsv1.EventList
		if err := f.c.List(t.Context(), &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return false, err.Error()
		}
		for _, e := range list.Items {
			if e.Regarding.Name == lost && e.Reason == EventNodeLost {
				return true, ""
			}
		}
		return false, "no NodeLost Event for " + lost
	})

	late := f.replica(f.ns, "late", lost)
	f.waitReplicas(nil, late)
	if diff := cmp.Diff([]string{"unbound", "b1"}, f.replicas(all...)); diff != "" {
		t.Errorf("replicas at the end (-want +got):\n%s", diff)
	}
}

// contactSince is a settable Contact: since when the manager has been in touch with
// the API server.
type contactSince struct {
	mu    sync.Mutex
	since time.Time
}

func (c *contactSince) Since(time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.since
}

func (c *contactSince) set(t time.Time) {
	c.mu.Lock()
	c.since = t
	c.mu.Unlock()
}

// TestOwnOutageGivesAgentsALease: when the manager itself was cut off from the API
// server, a Lease that expired meanwhile (its agent could not renew either) counts
// as live for a lease duration after contact came back; a Mac whose agent still does
// not renew is lost then, not before.
func TestOwnOutageGivesAgentsALease(t *testing.T) {
	contact := &contactSince{}
	f := newFixtureWith(t, contact)
	start := f.clk.Now()
	n := f.node("n", false, leaseSeconds*time.Second)
	f.obs.waitRequeue(t, n, start.Add(leaseSeconds*time.Second))

	// The manager was cut off from before the Lease's expiry until 5 s after it.
	back := start.Add((leaseSeconds + 5) * time.Second)
	contact.set(back)
	f.clk.Step((leaseSeconds + 5) * time.Second)
	f.touch(n)
	if p := f.obs.waitPass(t, n, f.clk.Now()); p.res.RequeueAfter != leaseSeconds*time.Second {
		t.Errorf("right after the outage: requeue after %s, want a whole lease (%ds)", p.res.RequeueAfter, leaseSeconds)
	}
	if c := f.ready(n); c.Status != metav1.ConditionTrue {
		t.Errorf("right after the outage the node's Ready is %+v, want it untouched", c)
	}

	// Its agent never renews: lost a lease duration after contact.
	f.clk.Step(leaseSeconds * time.Second)
	c := f.waitUnknown(n)
	if want := back.Add(leaseSeconds * time.Second); !c.LastTransitionTime.Time.Equal(want) {
		t.Errorf("Ready turned Unknown at %s, want a lease after contact, %s", c.LastTransitionTime, want)
	}
}

// TestRenewBeforeGraceKeepsReplicas: an agent that comes back within the grace
// period keeps its node's replicas.
func TestRenewBeforeGraceKeepsReplicas(t *testing.T) {
	f := newFixture(t)
	start := f.clk.Now()
	n := f.node("mac", false, leaseSeconds*time.Second)
	mr := f.replica(f.ns, "r1", n)

	expiry := start.Add(leaseSeconds * time.Second)
	f.obs.waitRequeue(t, n, expiry)
	f.clk.Step(leaseSeconds * time.Second)
	f.waitUnknown(n)
	f.obs.waitRequeue(t, n, expiry.Add(grace))

	f.clk.Step(grace / 2)
	f.renew(n)
	f.setReady(n)

	// At (and after) the original end of the grace period the node is alive.
	f.clk.Step(grace / 2)
	f.touch(n)
	f.obs.waitPass(t, n, expiry.Add(grace))
	if diff := cmp.Diff([]string{"r1"}, f.replicas(mr)); diff != "" {
		t.Errorf("replicas (-want +got):\n%s", diff)
	}
	if c := f.ready(n); c.Status != metav1.ConditionTrue {
		t.Errorf("Ready is %+v, want the agent's True", c)
	}
}

// TestRestartKeepsGraceStart: a controller that restarts in the middle of the grace
// period counts it from the original Ready=Unknown transition, not from its own
// start.
func TestRestartKeepsGraceStart(t *testing.T) {
	f := newFixture(t)
	start := f.clk.Now()
	n := f.node("mac", false, leaseSeconds*time.Second)
	mr := f.replica(f.ns, "r1", n)
	expiry := start.Add(leaseSeconds * time.Second)
	f.obs.waitRequeue(t, n, expiry)
	f.clk.Step(leaseSeconds * time.Second)
	f.waitUnknown(n)

	f.stop()
	f.clk.Step(grace / 2)
	restart := f.clk.Now()
	f.start()
	if p := f.obs.waitPass(t, n, restart); p.res.RequeueAfter != grace/2 {
		t.Errorf("after the restart: requeue after %s, want the rest of the original grace period %s", p.res.RequeueAfter, grace/2)
	}
	if diff := cmp.Diff([]string{"r1"}, f.replicas(mr)); diff != "" {
		t.Errorf("replicas in the grace period (-want +got):\n%s", diff)
	}
	f.obs.waitRequeue(t, n, expiry.Add(grace))
	f.clk.Step(grace / 2)
	f.waitReplicas(nil, mr)
}

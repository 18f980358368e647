package endpoints

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/endpoints/addressproof"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.ConsoleEncoder()))
	testenv.Main(m, &env, testenv.WithScheme(v1alpha1.AddToScheme))
}

const (
	wait = 20 * time.Second
	poll = 20 * time.Millisecond
)

// fixture is one test's controller and objects.
type fixture struct {
	t      *testing.T
	c      client.Client
	ns     string
	dep    *v1alpha1.ModelDeployment
	mu     sync.Mutex
	passes []time.Time // when each successful pass over the deployment started
	writes *countingClient
}

// countingClient counts the controller's successful writes. (A pass working from a
// cache that has not seen the controller's last write yet may send a write that
// fails its optimistic lock; that writes nothing.)
type countingClient struct {
	client.Client
	n atomic.Int64
}

func (c *countingClient) count(err error) error {
	if err == nil {
		c.n.Add(1)
	}
	return err
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return c.count(c.Client.Create(ctx, obj, opts...))
}

func (c *countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.count(c.Client.Update(ctx, obj, opts...))
}

func (c *countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.count(c.Client.Patch(ctx, obj, patch, opts...))
}

func (c *countingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return c.count(c.Client.Delete(ctx, obj, opts...))
}

// newFixture starts the controller and creates a deployment named qwen-7b in a
// new namespace.
func newFixture(t *testing.T) *fixture { return newFixtureIn(t, testenv.NewNamespace(t, env.Client)) }

// newFixtureIn starts the controller and creates a deployment named qwen-7b in ns.
func newFixtureIn(t *testing.T, ns string) *fixture {
	f := &fixture{t: t, c: env.Client, ns: ns}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Only this test's namespace: other tests' deployments linger (envtest deletes
		// no namespace contents) and must not add writes.
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}, ByObject: CacheByObject()},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	wrap := func(r reconcile.Reconciler) reconcile.Reconciler {
		return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			start := time.Now()
			res, err := r.Reconcile(ctx, req)
			if err == nil && req.Namespace == f.ns {
				f.mu.Lock()
				f.passes = append(f.passes, start)
				f.mu.Unlock()
			}
			return res, err
		})
	}
	f.writes = &countingClient{Client: mgr.GetClient()}
	if err := (&Reconciler{Client: f.writes, Addresses: provenAll{}}).setup(mgr, wrap); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	f.dep = &v1alpha1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "qwen-7b"},
		Spec:       v1alpha1.ModelDeploymentSpec{Model: v1alpha1.ModelSource{Source: "hf://org/repo/qwen-7b.gguf"}},
	}
	if err := f.c.Create(t.Context(), f.dep); err != nil {
		t.Fatal(err)
	}
	return f
}

// node plays an agent: a MacNode at addr with the given Ready status. Its name is
// unique to the test (MacNodes are cluster-scoped).
func (f *fixture) node(suffix, addr string, ready metav1.ConditionStatus) string {
	f.t.Helper()
	n := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-" + suffix}}
	if err := f.c.Create(f.t.Context(), n); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = f.c.Delete(context.Background(), n) })
	n.Status.Agent.Address = addr
	n.Status.Conditions = []metav1.Condition{{Type: v1alpha1.MacNodeReady, Status: ready, Reason: "Test", LastTransitionTime: metav1.Now()}}
	if err := f.c.Status().Update(f.t.Context(), n); err != nil {
		f.t.Fatal(err)
	}
	return n.Name
}

func (f *fixture) setNodeReady(name string, ready metav1.ConditionStatus) {
	f.t.Helper()
	f.updateStatus(&v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}, func(o client.Object) {
		meta.SetStatusCondition(&o.(*v1alpha1.MacNode).Status.Conditions, metav1.Condition{Type: v1alpha1.MacNodeReady, Status: ready, Reason: "Test"})
	})
}

// replica creates a replica of the fixture's deployment bound to node with the
// given Ready status (none if empty).
func (f *fixture) replica(name, node string, ready metav1.ConditionStatus) *v1alpha1.ModelReplica {
	f.t.Helper()
	mr := &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name,
			Labels:          map[string]string{v1alpha1.LabelDeployment: f.dep.Name, v1alpha1.LabelTemplateHash: "h1"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(f.dep, v1alpha1.GroupVersion.WithKind("ModelDeployment"))}},
		Spec: v1alpha1.ModelReplicaSpec{
			Template:          v1alpha1.ModelReplicaTemplate{Model: f.dep.Spec.Model},
			TemplateHash:      "h1",
			MemoryReservation: resource.MustParse("1Gi"),
			NodeName:          node,
		},
	}
	if err := f.c.Create(f.t.Context(), mr); err != nil {
		f.t.Fatal(err)
	}
	if ready != "" {
		f.setReplicaReady(mr, ready)
	}
	return mr
}

func (f *fixture) setReplicaReady(mr *v1alpha1.ModelReplica, ready metav1.ConditionStatus) {
	f.t.Helper()
	f.updateStatus(mr.DeepCopy(), func(o client.Object) {
		meta.SetStatusCondition(&o.(*v1alpha1.ModelReplica).Status.Conditions, metav1.Condition{Type: v1alpha1.ReplicaReady, Status: ready, Reason: "Test"})
	})
}

func (f *fixture) updateStatus(obj client.Object, mutate func(client.Object)) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := f.c.Get(f.t.Context(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		mutate(obj)
		return f.c.Status().Update(f.t.Context(), obj)
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// sliceView is what the tests compare of an EndpointSlice.
type sliceView struct {
	Name        string
	AddressType discoveryv1.AddressType
	Port        int32
	Endpoints   []endpointView
}

type endpointView struct {
	Address, Hostname, Replica string
	Ready, Serving             bool
}

func (f *fixture) slices() ([]sliceView, []discoveryv1.EndpointSlice) {
	f.t.Helper()
	var list discoveryv1.EndpointSliceList
	if err := f.c.List(f.t.Context(), &list, client.InNamespace(f.ns), client.MatchingLabels{discoveryv1.LabelServiceName: "qwen-7b"}); err != nil {
		f.t.Fatal(err)
	}
	var views []sliceView
	for _, s := range list.Items {
		v := sliceView{Name: s.Name, AddressType: s.AddressType}
		if len(s.Ports) == 1 {
			v.Port = ptr.Deref(s.Ports[0].Port, 0)
		}
		for _, e := range s.Endpoints {
			v.Endpoints = append(v.Endpoints, endpointView{Address: e.Addresses[0], Hostname: ptr.Deref(e.Hostname, ""),
				Replica: e.TargetRef.Name, Ready: ptr.Deref(e.Conditions.Ready, false), Serving: ptr.Deref(e.Conditions.Serving, false)})
		}
		views = append(views, v)
	}
	return views, list.Items
}

// waitSlices waits until the deployment's slices look like want.
func (f *fixture) waitSlices(want []sliceView) []discoveryv1.EndpointSlice {
	f.t.Helper()
	var items []discoveryv1.EndpointSlice
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		var got []sliceView
		got, items = f.slices()
		return cmp.Equal(want, got), fmt.Sprintf("slices (-want +got):\n%s", cmp.Diff(want, got))
	})
	return items
}

// waitPass waits for a successful pass over the deployment that started after since.
func (f *fixture) waitPass(since time.Time) {
	f.t.Helper()
	testenv.Eventually(f.t, wait, poll, func() (bool, string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, p := range f.passes {
			if p.After(since) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no pass since %s", since)
	})
}

func (f *fixture) deleteReplica(mr *v1alpha1.ModelReplica) {
	f.t.Helper()
	if err := f.c.Delete(f.t.Context(), mr); err != nil {
		f.t.Fatal(err)
	}
}

// TestEndpointSlices covers the slices' content for ready and not-ready replicas on
// several nodes with different ports, a node turning Ready=Unknown (and back)
// without any replica change, replica deletion down to the empty placeholder, and
// the absence of writes when nothing changed.
func TestEndpointSlices(t *testing.T) {
	f := newFixture(t)
	ep := func(addr, node, replica string, ready bool) endpointView {
		return endpointView{Address: addr, Hostname: node, Replica: replica, Ready: ready, Serving: ready}
	}
	empty := []sliceView{{Name: "qwen-7b-empty", AddressType: discoveryv1.AddressTypeIPv4}}
	f.waitSlices(empty)

	n1 := f.node("n1", "10.0.0.11:8080", metav1.ConditionTrue)
	n2 := f.node("n2", "10.0.0.2:8080", metav1.ConditionTrue)
	n3 := f.node("n3", "10.0.0.3:9090", metav1.ConditionTrue)
	n4 := f.node("n4", "10.0.0.4:8080", metav1.ConditionUnknown)
	n5 := f.node("n5", "10.0.0.5:8080", metav1.ConditionTrue)
	f.replica("r1", n1, metav1.ConditionTrue)
	r2 := f.replica("r2", n2, metav1.ConditionTrue)
	f.replica("r3", n3, metav1.ConditionTrue)
	f.replica("r4", n4, metav1.ConditionTrue)
	r5 := f.replica("r5", n5, metav1.ConditionFalse) // loading
	f.replica("r6", "", "")                          // not scheduled yet

	f.waitSlices([]sliceView{
		{Name: "qwen-7b-ipv4-8080", AddressType: discoveryv1.AddressTypeIPv4, Port: 8080, Endpoints: []endpointView{
			ep("10.0.0.11", n1, "r1", true), ep("10.0.0.2", n2, "r2", true), ep("10.0.0.4", n4, "r4", false)}},
		{Name: "qwen-7b-ipv4-9090", AddressType: discoveryv1.AddressTypeIPv4, Port: 9090, Endpoints: []endpointView{
			ep("10.0.0.3", n3, "r3", true)}},
	})

	// The node's agent stops: only the MacNode changes.
	f.setNodeReady(n1, metav1.ConditionUnknown)
	want := []sliceView{
		{Name: "qwen-7b-ipv4-8080", AddressType: discoveryv1.AddressTypeIPv4, Port: 8080, Endpoints: []endpointView{
			ep("10.0.0.11", n1, "r1", false), ep("10.0.0.2", n2, "r2", true), ep("10.0.0.4", n4, "r4", false)}},
		{Name: "qwen-7b-ipv4-9090", AddressType: discoveryv1.AddressTypeIPv4, Port: 9090, Endpoints: []endpointView{
			ep("10.0.0.3", n3, "r3", true)}},
	}
	f.waitSlices(want)

	// A replica finishes loading.
	f.setReplicaReady(r5, metav1.ConditionTrue)
	want[0].Endpoints = append(want[0].Endpoints, ep("10.0.0.5", n5, "r5", true))
	f.waitSlices(want)

	// Nothing changed: a pass sends no write, and nothing is rewritten. The pass that
	// wrote the slices above may not have counted its write yet (the API server has
	// it, the client call has not returned): one pass more, and the worker (one) is
	// done with it.
	touch := func() {
		before := time.Now()
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"test/touched":"%d"}}}`, before.UnixNano())
		if err := f.c.Patch(t.Context(), f.dep.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
		f.waitPass(before)
	}
	touch()
	_, items := f.slices()
	writes := f.writes.n.Load()
	versions := map[string]string{}
	for _, s := range items {
		versions[s.Name] = s.ResourceVersion
	}
	var svc corev1.Service
	if err := f.c.Get(t.Context(), types.NamespacedName{Namespace: f.ns, Name: "qwen-7b"}, &svc); err != nil {
		t.Fatal(err)
	}
	versions["service"] = svc.ResourceVersion
	touch()
	_, items = f.slices()
	if err := f.c.Get(t.Context(), types.NamespacedName{Namespace: f.ns, Name: "qwen-7b"}, &svc); err != nil {
		t.Fatal(err)
	}
	after := map[string]string{"service": svc.ResourceVersion}
	for _, s := range items {
		after[s.Name] = s.ResourceVersion
	}
	if diff := cmp.Diff(versions, after); diff != "" {
		t.Errorf("a pass with nothing to do wrote objects (resourceVersions -before +after):\n%s", diff)
	}
	if n := f.writes.n.Load() - writes; n != 0 {
		t.Errorf("a pass with nothing to do sent %d writes", n)
	}

	f.setNodeReady(n1, metav1.ConditionTrue)
	want[0].Endpoints[0].Ready, want[0].Endpoints[0].Serving = true, true
	f.waitSlices(want)

	f.deleteReplica(r2)
	want[0].Endpoints = append(want[0].Endpoints[:1], want[0].Endpoints[2:]...)
	f.waitSlices(want)

	var all v1alpha1.ModelReplicaList
	if err := f.c.List(t.Context(), &all, client.InNamespace(f.ns)); err != nil {
		t.Fatal(err)
	}
	for i := range all.Items {
		f.deleteReplica(&all.Items[i])
	}
	f.waitSlices(empty)
}

// TestService checks the Service's shape and that a hand edit is undone.
func TestService(t *testing.T) {
	f := newFixture(t)
	key := types.NamespacedName{Namespace: f.ns, Name: "qwen-7b"}
	var svc corev1.Service
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		err := f.c.Get(t.Context(), key, &svc)
		return err == nil, fmt.Sprintf("getting the Service: %v", err)
	})
	var dep v1alpha1.ModelDeployment
	if err := f.c.Get(t.Context(), client.ObjectKeyFromObject(f.dep), &dep); err != nil {
		t.Fatal(err)
	}
	wantPorts := []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To("http"), Port: 8080, TargetPort: intstr.FromInt32(8080)}}
	type shape struct {
		Type      corev1.ServiceType
		Selector  map[string]string
		Ports     []corev1.ServicePort
		Owner     *metav1.OwnerReference
		ManagedBy string
		HasIP     bool
	}
	shapeOf := func(s *corev1.Service) shape {
		return shape{Type: s.Spec.Type, Selector: s.Spec.Selector, Ports: s.Spec.Ports, Owner: metav1.GetControllerOf(s),
			ManagedBy: s.Labels[LabelManagedBy], HasIP: s.Spec.ClusterIP != "" && s.Spec.ClusterIP != corev1.ClusterIPNone}
	}
	want := shape{Type: corev1.ServiceTypeClusterIP, Ports: wantPorts, ManagedBy: "macfleet", HasIP: true,
		Owner: &metav1.OwnerReference{APIVersion: "macfleet.dev/v1alpha1", Kind: "ModelDeployment", Name: "qwen-7b", UID: dep.UID,
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	if diff := cmp.Diff(want, shapeOf(&svc)); diff != "" {
		t.Errorf("Service (-want +got):\n%s", diff)
	}

	edited := svc.DeepCopy()
	edited.Spec.Ports[0].Port = 9999
	edited.Spec.Selector = map[string]string{"app": "x"}
	if err := f.c.Update(t.Context(), edited); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		if err := f.c.Get(t.Context(), key, &svc); err != nil {
			return false, err.Error()
		}
		diff := cmp.Diff(want, shapeOf(&svc))
		return diff == "", "Service not restored (-want +got):\n" + diff
	})
}

// TestServiceConflict: a Service of the same name that the deployment does not
// control is left alone, no slices are published, and an Event says why.
func TestServiceConflict(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	foreign := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen-7b"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "web", Port: 80}}}}
	if err := env.Client.Create(t.Context(), foreign); err != nil {
		t.Fatal(err)
	}
	f := newFixtureIn(t, ns)
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		var list eventsv1.EventList
		if err := f.c.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, e := range list.Items {
			if e.Reason == EventServiceConflict && e.Regarding.Name == "qwen-7b" {
				return true, ""
			}
		}
		return false, "no ServiceConflict Event"
	})
	var svc corev1.Service
	if err := f.c.Get(t.Context(), client.ObjectKeyFromObject(foreign), &svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Ports[0].Port != 80 || len(svc.OwnerReferences) != 0 {
		t.Errorf("the foreign Service was changed: %+v", svc)
	}
	if got, _ := f.slices(); len(got) != 0 {
		t.Errorf("slices published for a foreign Service: %+v", got)
	}
}

// TestEndpointSlicesLeaveOutClaimsNotTheMacs: a Mac whose agent address is the API
// server's (the kubernetes Service's cluster IP, read from this API server) or
// another Mac's gets no endpoint in a tenant's EndpointSlice.
func TestEndpointSlicesLeaveOutClaimsNotTheMacs(t *testing.T) {
	f := newFixture(t)
	var kubernetes corev1.Service
	if err := f.c.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "kubernetes"}, &kubernetes); err != nil {
		t.Fatal(err)
	}
	honest := f.node("honest", "10.0.7.1:8080", metav1.ConditionTrue)
	apiServer := f.node("apiserver", net.JoinHostPort(kubernetes.Spec.ClusterIP, "8080"), metav1.ConditionTrue)
	twinA := f.node("twin-a", "10.0.7.2:8080", metav1.ConditionTrue)
	twinB := f.node("twin-b", "10.0.7.2:8080", metav1.ConditionTrue)
	for i, n := range []string{honest, apiServer, twinA, twinB} {
		f.replica(fmt.Sprintf("r%d", i), n, metav1.ConditionTrue)
	}
	f.waitSlices([]sliceView{{Name: "qwen-7b-ipv4-8080", AddressType: discoveryv1.AddressTypeIPv4, Port: 8080,
		Endpoints: []endpointView{{Address: "10.0.7.1", Hostname: honest, Replica: "r0", Ready: true, Serving: true}}}})
}

// provenAll proves every address: these tests are about the slices (the documentation
// addresses they use have no listener); addressproof's tests and
// test/e2e's TestAttackForeignListenerInTenantSlices are about the proof.
type provenAll struct{}

func (provenAll) Verify(context.Context, string, string, time.Time) (addressproof.Verdict, bool) {
	return addressproof.Verdict{Proven: true}, false
}

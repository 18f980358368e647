package macnode

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, &env, testenv.WithScheme(v1alpha1.AddToScheme))
}

const (
	wait = 30 * time.Second // real time allowed for the session to react
	poll = 20 * time.Millisecond
)

// Log messages the tests count.
const (
	outageMsg   = "Cannot update the node in the API server; the agent keeps serving and retries"
	recoveryMsg = "Reached the API server again; node resynced"
)

// mac is the simulated Mac of most tests.
var mac = hardware.Info{Chip: "Apple M2 Max", CPUCores: 12, GPUCores: 38, UnifiedMemoryBytes: 32 * gib,
	MetalWorkingSetBytes: 22906492245, Arch: "arm64", OS: "darwin"}

// fakeMemory is a MemorySource the test changes.
type fakeMemory struct {
	mu sync.Mutex
	m  Memory
}

func (f *fakeMemory) NodeMemory() Memory {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m
}

func (f *fakeMemory) update(fn func(*Memory)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.m)
}

func newMemory() *fakeMemory {
	return &fakeMemory{m: Memory{CeilingBytes: 20 * gib, SoftWatermarkBytes: 18 * gib, HardWatermarkBytes: 19 * gib,
		UsedBytes: gib, CommittedBytes: 4 * gib, Pressure: v1alpha1.PressureOK, Evictions: 2, FreedBytesTotal: 3 * gib}}
}

// logSink records every log line's message.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

// logger records into s and into the test's log.
func (s *logSink) logger(t *testing.T) logr.Logger {
	return funcr.New(func(prefix, args string) {
		t.Log(prefix, args)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.lines = append(s.lines, args)
	}, funcr.Options{Verbosity: 1})
}

// count is the number of lines whose message is msg.
func (s *logSink) count(msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.lines {
		if strings.Contains(l, fmt.Sprintf("%q", msg)) {
			n++
		}
	}
	return n
}

func nodeName(*testing.T) string {
	return "mac-" + utilrand.String(6)
}

// leaseNamespace makes sure macfleet-node-lease exists (the chart creates it).
func leaseNamespace(t *testing.T) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.NodeLeaseNamespace}}
	if err := env.Client.Create(t.Context(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// running is a session under test.
type running struct {
	s      *Session
	cancel context.CancelFunc
	done   chan error
	rounds chan error
}

// start runs a session for cfg until the test ends (or stop is called).
func start(t *testing.T, cfg Config) *running {
	t.Helper()
	leaseNamespace(t)
	if cfg.Client == nil {
		cfg.Client = env.Client
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = testLogger(t)
	}
	if cfg.RequestTimeout == 0 {
		// Generous: other packages' tests load the machine, and the API server holds
		// the first create of a custom resource for 2s after its CRD is established.
		cfg.RequestTimeout = 10 * time.Second
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &running{s: s, done: make(chan error, 1), rounds: make(chan error, 1000)}
	s.afterRound = func(err error) {
		select {
		case r.rounds <- err:
		default:
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- s.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends the session and waits for Run to return.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
		r.done <- err // for a second stop
	case <-time.After(wait):
		t.Fatal("Run did not return after its context ended")
	}
}

// round waits for the next round and returns its error.
func (r *running) round(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.rounds:
		return err
	case <-time.After(wait):
		t.Fatal("no session round within the deadline")
		return nil
	}
}

func testLogger(t *testing.T) logr.Logger {
	return funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{Verbosity: 1})
}

func getNode(t *testing.T, c client.Client, name string) *v1alpha1.MacNode {
	t.Helper()
	var n v1alpha1.MacNode
	if err := c.Get(t.Context(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatalf("getting MacNode %s: %v", name, err)
	}
	return &n
}

func getLease(t *testing.T, name string) (*coordinationv1.Lease, error) {
	var l coordinationv1.Lease
	err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeLeaseNamespace, Name: name}, &l)
	return &l, err
}

// readyIs waits for the node's Ready condition to have status and reason.
func readyIs(t *testing.T, name string, status metav1.ConditionStatus, reason string) *v1alpha1.MacNode {
	t.Helper()
	var node v1alpha1.MacNode
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		if err := env.Client.Get(t.Context(), client.ObjectKey{Name: name}, &node); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(node.Status.Conditions, v1alpha1.MacNodeReady)
		if c == nil || c.Status != status || c.Reason != reason {
			return false, fmt.Sprintf("Ready is %+v, want %s/%s", c, status, reason)
		}
		return true, ""
	})
	return &node
}

// setReadyUnknown does what the macnode controller does when the Lease expires.
func setReadyUnknown(t *testing.T, c client.Client, name string) time.Time {
	t.Helper()
	node := getNode(t, c, name)
	before := node.DeepCopy()
	at := metav1.Now().Rfc3339Copy()
	meta.SetStatusCondition(&node.Status.Conditions, metav1.Condition{Type: v1alpha1.MacNodeReady, Status: metav1.ConditionUnknown,
		Reason: v1alpha1.ReasonLeaseExpired, Message: "expired", LastTransitionTime: at})
	if err := c.Status().Patch(t.Context(), node, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		t.Fatalf("setting Ready=Unknown: %v", err)
	}
	return at.Time
}

func bytesOf(q *resource.Quantity) int64 {
	if q == nil {
		return 0
	}
	return q.Value()
}

// TestRegister: the session creates its MacNode with the well-known labels, hardware,
// agent and memory status and Ready=True, creates its Lease, and marks the node
// Ready=False (AgentStopping) when it stops.
func TestRegister(t *testing.T) {
	t.Parallel()
	name := nodeName(t)
	mem := newMemory()
	r := start(t, Config{NodeName: name, Hardware: mac, Address: "10.1.2.3:8080", Version: "v0.4.0", Memory: mem,
		LeaseDuration: 4 * time.Second})

	node := readyIs(t, name, metav1.ConditionTrue, v1alpha1.ReasonAgentReady)
	wantLabels := map[string]string{v1alpha1.LabelChip: "Apple-M2-Max", v1alpha1.LabelMemoryGiB: "32",
		"kubernetes.io/arch": "arm64", "kubernetes.io/os": "darwin"}
	if diff := cmp.Diff(wantLabels, node.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(hardwareStatus(mac), node.Status.Hardware, quantityCmp); diff != "" {
		t.Errorf("hardware (-want +got):\n%s", diff)
	}
	if got := node.Status.Hardware; got.Chip != "Apple M2 Max" || got.GPUCores != 38 || bytesOf(got.UnifiedMemory) != 32*gib {
		t.Errorf("hardware = %+v", got)
	}
	if want := (v1alpha1.AgentStatus{Version: "v0.4.0", Address: "10.1.2.3:8080"}); node.Status.Agent != want {
		t.Errorf("agent = %+v, want %+v", node.Status.Agent, want)
	}
	if diff := cmp.Diff(memoryStatus(mem.NodeMemory()), node.Status.Memory, quantityCmp); diff != "" {
		t.Errorf("memory (-want +got):\n%s", diff)
	}
	if c := meta.FindStatusCondition(node.Status.Conditions, v1alpha1.MacNodeMemoryPressure); c == nil ||
		c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonPressureOK {
		t.Errorf("MemoryPressure = %+v, want False/PressureOK", c)
	}
	if node.Spec != (v1alpha1.MacNodeSpec{}) {
		t.Errorf("spec = %+v, want empty", node.Spec)
	}

	lease, err := getLease(t, name)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(lease.Spec.HolderIdentity, "") != name || ptr.Deref(lease.Spec.LeaseDurationSeconds, 0) != 4 ||
		lease.Spec.RenewTime == nil || lease.Spec.AcquireTime == nil {
		t.Errorf("Lease spec = %+v", lease.Spec)
	}
	if len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0].UID != node.UID || lease.OwnerReferences[0].Kind != "MacNode" {
		t.Errorf("Lease owners = %+v, want the MacNode %s", lease.OwnerReferences, node.UID)
	}

	r.stop(t)
	node = getNode(t, env.Client, name)
	if c := meta.FindStatusCondition(node.Status.Conditions, v1alpha1.MacNodeReady); c == nil ||
		c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonAgentStopping {
		t.Errorf("Ready after stop = %+v, want False/AgentStopping", c)
	}
}

// TestLeaseRenewalCadence: on a fake clock the Lease is renewed exactly when a
// quarter of its duration has passed, with renewTime from the clock.
func TestLeaseRenewalCadence(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	name := nodeName(t)
	r := start(t, Config{NodeName: name, Hardware: mac, Address: "10.1.2.3:8080", Memory: newMemory(), Clock: clk})
	if got := r.s.RenewInterval(); got != 10*time.Second {
		t.Fatalf("RenewInterval = %v, want 10s for the default 40s Lease", got)
	}
	if err := r.round(t); err != nil {
		t.Fatalf("first round: %v", err)
	}
	renewTime := func() time.Time {
		l, err := getLease(t, name)
		if err != nil {
			t.Fatal(err)
		}
		if ptr.Deref(l.Spec.LeaseDurationSeconds, 0) != 40 {
			t.Errorf("leaseDurationSeconds = %v, want 40", l.Spec.LeaseDurationSeconds)
		}
		return l.Spec.RenewTime.UTC()
	}
	if got := renewTime(); !got.Equal(t0) {
		t.Fatalf("renewTime = %v, want %v", got, t0)
	}

	// Just before the renewal is due nothing happens.
	step(t, clk, 10*time.Second-time.Millisecond)
	select {
	case err := <-r.rounds:
		t.Fatalf("a round ran before the renewal was due (err %v)", err)
	default:
	}
	for i := 1; i <= 3; i++ {
		if i == 1 {
			step(t, clk, time.Millisecond)
		} else {
			step(t, clk, 10*time.Second)
		}
		if err := r.round(t); err != nil {
			t.Fatal(err)
		}
		if got, want := renewTime(), t0.Add(time.Duration(i)*10*time.Second); !got.Equal(want) {
			t.Errorf("renewal %d: renewTime = %v, want %v", i, got, want)
		}
	}
}

// step advances the fake clock once the session waits on it.
func step(t *testing.T, clk *clocktesting.FakeClock, d time.Duration) {
	t.Helper()
	testenv.Eventually(t, wait, time.Millisecond, func() (bool, string) {
		return clk.HasWaiters(), "the session is not waiting on the clock"
	})
	clk.Step(d)
}

// TestMemoryStatus: NotifyChanged writes the memory account at once; on renewals only
// changes beyond the measured usage are written; the usage is refreshed every
// StatusInterval.
func TestMemoryStatus(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	name := nodeName(t)
	mem := newMemory()
	r := start(t, Config{NodeName: name, Hardware: mac, Address: "10.1.2.3:8080", Memory: mem, Clock: clk})
	if err := r.round(t); err != nil {
		t.Fatal(err)
	}
	memoryIs := func(what string, used, committed int64, pressure v1alpha1.PressureLevel) {
		t.Helper()
		m := getNode(t, env.Client, name).Status.Memory
		if bytesOf(m.Used) != used || bytesOf(m.Committed) != committed || m.Pressure != pressure {
			t.Errorf("%s: memory used=%d committed=%d pressure=%s, want %d, %d, %s", what,
				bytesOf(m.Used), bytesOf(m.Committed), m.Pressure, used, committed, pressure)
		}
	}
	memoryIs("registered", gib, 4*gib, v1alpha1.PressureOK)

	// A notification writes within MinNotifyInterval (1s), long before the renewal.
	mem.update(func(m *Memory) { m.UsedBytes, m.AgentBytes, m.CommittedBytes = 2*gib, 64<<20, 6*gib })
	r.s.NotifyChanged()
	step(t, clk, time.Second)
	if err := r.round(t); err != nil {
		t.Fatal(err)
	}
	memoryIs("after NotifyChanged", 2*gib, 6*gib, v1alpha1.PressureOK)
	agentIs := func(what string, want int64) {
		t.Helper()
		if got := bytesOf(getNode(t, env.Client, name).Status.Memory.Agent); got != want {
			t.Errorf("%s: the agent's own memory = %d, want %d", what, got, want)
		}
	}
	agentIs("after NotifyChanged", 64<<20)

	// The usage alone moving is not written at renewals (t0+10s, +20s, +30s) …
	mem.update(func(m *Memory) { m.UsedBytes, m.AgentBytes = 3*gib, 70<<20 })
	for i := range 3 {
		step(t, clk, []time.Duration{9 * time.Second, 10 * time.Second, 10 * time.Second}[i])
		if err := r.round(t); err != nil {
			t.Fatal(err)
		}
		memoryIs(fmt.Sprintf("renewal %d", i+1), 2*gib, 6*gib, v1alpha1.PressureOK)
		agentIs(fmt.Sprintf("renewal %d", i+1), 64<<20)
	}
	// … but StatusInterval (30s) after the last write it is.
	step(t, clk, time.Second)
	if err := r.round(t); err != nil {
		t.Fatal(err)
	}
	memoryIs("after StatusInterval", 3*gib, 6*gib, v1alpha1.PressureOK)
	agentIs("after StatusInterval", 70<<20)

	// A pressure change is written at the next renewal even without a notification,
	// with the usage of the moment, and raises MemoryPressure.
	mem.update(func(m *Memory) { m.UsedBytes, m.Pressure, m.Evictions = 18*gib+1, v1alpha1.PressureSoft, 3 })
	step(t, clk, 9*time.Second) // t0+40s
	if err := r.round(t); err != nil {
		t.Fatal(err)
	}
	memoryIs("pressure", 18*gib+1, 6*gib, v1alpha1.PressureSoft)
	node := getNode(t, env.Client, name)
	if c := meta.FindStatusCondition(node.Status.Conditions, v1alpha1.MacNodeMemoryPressure); c == nil ||
		c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonPressureSoft || !c.LastTransitionTime.Time.Equal(t0.Add(40*time.Second)) {
		t.Errorf("MemoryPressure = %+v, want True/%s since t0+40s", c, v1alpha1.ReasonPressureSoft)
	}
	if node.Status.Memory.Evictions != 3 {
		t.Errorf("evictions = %d, want 3", node.Status.Memory.Evictions)
	}
}

// TestNotifyCoalesces: notifications before the session takes them are one.
func TestNotifyCoalesces(t *testing.T) {
	s, err := New(Config{Client: env.Client, NodeName: "coalesce"})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		s.NotifyChanged()
	}
	if n := len(s.notify); n != 1 {
		t.Errorf("%d notifications pending, want 1", n)
	}
}

// TestReadyRestoredOnRenew: when the macnode controller has set Ready=Unknown, the
// agent sets it back to True at its next renewal.
func TestReadyRestoredOnRenew(t *testing.T) {
	t.Parallel()
	name := nodeName(t)
	start(t, Config{NodeName: name, Hardware: mac, Address: "10.1.2.3:8080", Memory: newMemory(),
		LeaseDuration: 2 * time.Second})
	readyIs(t, name, metav1.ConditionTrue, v1alpha1.ReasonAgentReady)
	for range 2 {
		at := setReadyUnknown(t, env.Client, name)
		node := readyIs(t, name, metav1.ConditionTrue, v1alpha1.ReasonAgentReady)
		if c := meta.FindStatusCondition(node.Status.Conditions, v1alpha1.MacNodeReady); c.LastTransitionTime.Time.Before(at) {
			t.Errorf("Ready restored with lastTransitionTime %v before the Unknown at %v", c.LastTransitionTime, at)
		}
	}
}

// TestAdminSpec: an administrator's spec and labels survive registration, the
// agent's labels are corrected, and spec.memoryCeiling reaches the agent as it changes.
func TestAdminSpec(t *testing.T) {
	t.Parallel()
	leaseNamespace(t)
	name := nodeName(t)
	ceiling := resource.MustParse("8Gi")
	pre := &v1alpha1.MacNode{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": "a", v1alpha1.LabelChip: "stale"}},
		Spec:       v1alpha1.MacNodeSpec{Unschedulable: true, MemoryCeiling: &ceiling},
	}
	if err := env.Client.Create(t.Context(), pre); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var overrides []int64
	seen := func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]int64(nil), overrides...)
	}
	r := start(t, Config{NodeName: name, Hardware: mac, Address: "10.1.2.3:8080", Memory: newMemory(),
		LeaseDuration: 2 * time.Second,
		Ceiling: ceilingFunc(func(b int64) {
			mu.Lock()
			defer mu.Unlock()
			overrides = append(overrides, b)
		})})
	node := readyIs(t, name, metav1.ConditionTrue, v1alpha1.ReasonAgentReady)
	if node.UID != pre.UID {
		t.Fatalf("the MacNode was recreated (uid %s, was %s)", node.UID, pre.UID)
	}
	if !node.Spec.Unschedulable || node.Spec.MemoryCeiling == nil || node.Spec.MemoryCeiling.Cmp(ceiling) != 0 {
		t.Errorf("spec = %+v, want the administrator's", node.Spec)
	}
	if node.Labels["team"] != "a" || node.Labels[v1alpha1.LabelChip] != "Apple-M2-Max" || node.Labels[v1alpha1.LabelMemoryGiB] != "32" {
		t.Errorf("labels = %v, want team=a kept and the chip corrected", node.Labels)
	}
	if got, known := r.s.CeilingOverride(); !known || got != 8*gib {
		t.Errorf("CeilingOverride() = %d, %v; want 8Gi", got, known)
	}

	setCeiling := func(q *resource.Quantity) {
		t.Helper()
		node := getNode(t, env.Client, name)
		before := node.DeepCopy()
		node.Spec.MemoryCeiling = q
		if err := env.Client.Patch(t.Context(), node, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
	}
	six := resource.MustParse("6Gi")
	setCeiling(&six)
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		got := seen()
		return cmp.Equal(got, []int64{8 * gib, 6 * gib}), fmt.Sprintf("overrides %v", got)
	})
	setCeiling(nil)
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		got := seen()
		return cmp.Equal(got, []int64{8 * gib, 6 * gib, 0}), fmt.Sprintf("overrides %v", got)
	})
	if got, known := r.s.CeilingOverride(); !known || got != 0 {
		t.Errorf("CeilingOverride() = %d, %v; want 0 after removal", got, known)
	}
	node = getNode(t, env.Client, name)
	if !node.Spec.Unschedulable || node.Spec.MemoryCeiling != nil || node.Labels["team"] != "a" {
		t.Errorf("after the agent ran: spec %+v labels %v", node.Spec, node.Labels)
	}
}

// TestReregisters: a MacNode or Lease deleted while the agent runs comes back at the
// next round, without being taken for an outage.
func TestReregisters(t *testing.T) {
	t.Parallel()
	name := nodeName(t)
	logs := &logSink{}
	start(t, Config{NodeName: name, Hardware: mac, Address: "10.1.2.3:8080", Memory: newMemory(), LeaseDuration: 2 * time.Second,
		Log: logs.logger(t)})
	old := readyIs(t, name, metav1.ConditionTrue, v1alpha1.ReasonAgentReady)
	if err := env.Client.Delete(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	lease, err := getLease(t, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(t.Context(), lease); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		var n v1alpha1.MacNode
		if err := env.Client.Get(t.Context(), client.ObjectKey{Name: name}, &n); err != nil {
			return false, err.Error()
		}
		if n.UID == old.UID {
			return false, "still the old MacNode"
		}
		c := meta.FindStatusCondition(n.Status.Conditions, v1alpha1.MacNodeReady)
		if c == nil || c.Status != metav1.ConditionTrue || n.Labels[v1alpha1.LabelChip] == "" {
			return false, fmt.Sprintf("new MacNode without status or labels: %+v", n)
		}
		l, err := getLease(t, name)
		if err != nil {
			return false, "Lease: " + err.Error()
		}
		if l.UID == lease.UID {
			return false, "still the old Lease"
		}
		return true, ""
	})
	if n := logs.count(outageMsg); n != 0 {
		t.Errorf("the deletions were logged as %d outage(s)", n)
	}
}

// TestAPIOutage: with the API server unreachable the session keeps running, logs the
// outage once, and when the server is back it renews the Lease and restores the
// Ready=True the controller took away meanwhile.
func TestAPIOutage(t *testing.T) {
	t.Parallel()
	cfg, proxy := testenv.RelayConfig(t, env.Config)
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}

	name := nodeName(t)
	logs := &logSink{}
	r := start(t, Config{Client: c, NodeName: name, Hardware: mac, Address: "10.1.2.3:8080", Memory: newMemory(),
		LeaseDuration: 2 * time.Second, RequestTimeout: 5 * time.Second, Log: logs.logger(t)})
	readyIs(t, name, metav1.ConditionTrue, v1alpha1.ReasonAgentReady)

	for outage := 1; outage <= 2; outage++ {
		// Under load a round may also time out before the cut: count from here.
		outages, recoveries := logs.count(outageMsg), logs.count(recoveryMsg)
		proxy.Cut()
		// Drain rounds that finished before the cut, then see several fail.
		failed := 0
		testenv.Eventually(t, wait, poll, func() (bool, string) {
			select {
			case err := <-r.rounds:
				if err != nil {
					failed++
				}
			default:
			}
			return failed >= 4, fmt.Sprintf("%d failed rounds", failed)
		})
		if n := logs.count(outageMsg) - outages; n != 1 {
			t.Errorf("outage %d: logged %d times, want once", outage, n)
		}
		select {
		case err := <-r.done:
			t.Fatalf("Run returned during the outage: %v", err)
		default:
		}
		// Meanwhile the controller declares the node lost.
		setReadyUnknown(t, env.Client, name)
		lease, err := getLease(t, name)
		if err != nil {
			t.Fatal(err)
		}
		cutRenew := lease.Spec.RenewTime.Time

		restored := time.Now()
		if err := proxy.Restore(); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, wait, poll, func() (bool, string) {
			l, err := getLease(t, name)
			if err != nil {
				return false, err.Error()
			}
			return l.Spec.RenewTime.After(cutRenew), fmt.Sprintf("renewTime %v not after %v", l.Spec.RenewTime, cutRenew)
		})
		renewed := time.Since(restored)
		readyIs(t, name, metav1.ConditionTrue, v1alpha1.ReasonAgentReady)
		t.Logf("Outage %d: Lease renewed %v and Ready=True %v after the API server came back (renew interval %v)",
			outage, renewed.Round(time.Millisecond), time.Since(restored).Round(time.Millisecond), r.s.RenewInterval())
		testenv.Eventually(t, wait, poll, func() (bool, string) {
			n := logs.count(recoveryMsg) - recoveries
			return n >= 1, fmt.Sprintf("recovery logged %d times", n)
		})
	}
}

// ceilingFunc records the ceilings the session configures.
type ceilingFunc func(bytes int64)

func (f ceilingFunc) SetConfiguredCeiling(bytes int64) enginepool.Ceiling {
	f(bytes)
	return enginepool.Ceiling{Bytes: bytes}
}

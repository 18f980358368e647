package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/endpoints"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// readySliceAddresses returns host:port of the ready endpoints in a deployment's
// EndpointSlices.
func readySliceAddresses(t testing.TB, ns, name string) []string {
	t.Helper()
	var slices discoveryv1.EndpointSliceList
	if err := fleet.Client.List(t.Context(), &slices, client.InNamespace(ns),
		client.MatchingLabels{discoveryv1.LabelServiceName: endpoints.ServiceName(name)}); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, s := range slices.Items {
		if len(s.Ports) == 0 || s.Ports[0].Port == nil {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				for _, a := range ep.Addresses {
					addrs = append(addrs, net.JoinHostPort(a, strconv.Itoa(int(*s.Ports[0].Port))))
				}
			}
		}
	}
	return addrs
}

// scale sets spec.replicas through the scale subresource, as kubectl scale does.
func scale(t *testing.T, ns, name string, n int32) {
	t.Helper()
	md := &v1alpha1.ModelDeployment{}
	md.Namespace, md.Name = ns, name
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n))
	if err := fleet.Client.SubResource("scale").Patch(t.Context(), md, patch); err != nil {
		t.Fatal(err)
	}
}

func TestScaleUpAndDown(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "scaled", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Engine.Parallel = 1
		md.Spec.Placement.MaxReplicasPerNode = 2
	}))
	waitReady(t, ns, "scaled", 1, 3*time.Minute)
	scale(t, ns, "scaled", 3)
	replicas := waitReady(t, ns, "scaled", 3, 3*time.Minute)
	nodes := map[string]int{}
	for _, r := range replicas {
		nodes[r.Spec.NodeName]++
	}
	if len(nodes) != 2 {
		t.Errorf("3 replicas on %v, want both Macs used", nodes)
	}
	c := gatewayClient()
	for i := range 6 {
		if _, err := chat(t.Context(), c, "scaled", i%2 == 0); err != nil {
			t.Fatalf("chat %d at 3 replicas: %v", i, err)
		}
	}
	scale(t, ns, "scaled", 1)
	waitReady(t, ns, "scaled", 1, 2*time.Minute)
	if _, err := chat(t.Context(), c, "scaled", true); err != nil {
		t.Fatalf("chat after scaling down: %v", err)
	}
}

// load sends chats through the gateway from a few goroutines until stop is closed,
// counting successes and keeping every failure.
type load struct {
	ok   atomic.Int64
	mu   sync.Mutex
	errs []error
	stop chan struct{}
	wg   sync.WaitGroup
}

func startLoad(ctx context.Context, model string, workers int) *load {
	l := &load{stop: make(chan struct{})}
	c := gatewayClient()
	for w := range workers {
		l.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				if _, err := chat(ctx, c, model, (w+i)%2 == 0); err != nil {
					l.mu.Lock()
					l.errs = append(l.errs, fmt.Errorf("%s: %w", time.Now().Format("15:04:05.000"), err))
					l.mu.Unlock()
					continue
				}
				l.ok.Add(1)
			}
		})
	}
	return l
}

func (l *load) finish() (int64, []error) {
	close(l.stop)
	l.wg.Wait()
	return l.ok.Load(), l.errs
}

func TestRollingModelChangeWithoutFailedRequests(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "rolling", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.MaxReplicasPerNode = 2
	}))
	before := waitReady(t, ns, "rolling", 1, 3*time.Minute)

	l := startLoad(t.Context(), "rolling", 2)
	// Let the load reach the first replica before the change.
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		return l.ok.Load() >= 2, "two requests served"
	})
	// A merge patch of the one field: the manager writes the deployment's status
	// meanwhile, and a Get then Update would conflict with it.
	md := &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rolling"}}
	if err := fleet.Client.Patch(t.Context(), md,
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"engine":{"contextLength":768}}}`))); err != nil {
		t.Fatal(err)
	}
	after := waitReady(t, ns, "rolling", 1, 3*time.Minute)
	if after[0].Name == before[0].Name || after[0].Spec.Template.Engine.ContextLength != 768 {
		t.Errorf("after the change the replica is %s with context %d, before %s", after[0].Name,
			after[0].Spec.Template.Engine.ContextLength, before[0].Name)
	}
	// Keep the load going until the old replica is gone, then a little longer.
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		var old v1alpha1.ModelReplica
		err := fleet.Client.Get(t.Context(), client.ObjectKeyFromObject(&before[0]), &old)
		return apierrors.IsNotFound(err), fmt.Sprintf("old replica %s still there (%v)", before[0].Name, err)
	})
	served := l.ok.Load()
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		return l.ok.Load() >= served+2, "two requests after the old replica went away"
	})
	ok, errs := l.finish()
	if len(errs) > 0 {
		t.Errorf("%d of %d requests failed during the rolling change; first: %v", len(errs), ok+int64(len(errs)), errs[0])
	}
	t.Logf("%d requests served during the rolling change", ok)
}

// agentStatusErr reads an agent's /api/status with the fleet token.
func agentStatusErr(ctx context.Context, addr string) (map[string]any, error) {
	var st map[string]any
	err := agentGet(ctx, addr, "/api/status", &st)
	return st, err
}

// runnerPIDs returns the PID of every loaded model an agent reports.
func runnerPIDs(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	pids, err := runnerPIDsErr(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

func runnerPIDsErr(ctx context.Context, addr string) (map[string]float64, error) {
	st, err := agentStatusErr(ctx, addr)
	if err != nil {
		return nil, err
	}
	pids := map[string]float64{}
	models, _ := st["models"].([]any)
	for _, m := range models {
		mm, _ := m.(map[string]any)
		name, _ := mm["name"].(string)
		if pid, _ := mm["pid"].(float64); pid > 0 {
			pids[name] = pid
		}
	}
	return pids, nil
}

func TestOnDemandColdStartAndUnloadReport(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "ondemand", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Residency = v1alpha1.ResidencyOnDemand
		md.Spec.IdleTimeout = &metav1.Duration{Duration: 5 * time.Second}
	}))
	replicas := waitReady(t, ns, "ondemand", 1, 3*time.Minute)
	r := replicas[0]
	if conditionTrue(r.Status.Conditions, v1alpha1.ReplicaLoaded) {
		t.Errorf("an OnDemand replica is Loaded before any request: %s", describeReplicas(replicas))
	}
	// The first request loads the model and is answered.
	if _, err := chat(t.Context(), gatewayClient(), "ondemand", true); err != nil {
		t.Fatalf("first request to an OnDemand model: %v", err)
	}
	// After the idle timeout the agent unloads it and writes what the unload freed.
	testenv.Eventually(t, 2*time.Minute, 200*time.Millisecond, func() (bool, string) {
		var cur v1alpha1.ModelReplica
		if err := fleet.Client.Get(t.Context(), client.ObjectKeyFromObject(&r), &cur); err != nil {
			return false, err.Error()
		}
		u := cur.Status.LastUnload
		return u != nil && u.ResidentBytes > 0 && u.Outcome != "" && !conditionTrue(cur.Status.Conditions, v1alpha1.ReplicaLoaded),
			fmt.Sprintf("lastUnload %+v; %s", u, describeReplicas([]v1alpha1.ModelReplica{cur}))
	})
	var cur v1alpha1.ModelReplica
	if err := fleet.Client.Get(t.Context(), client.ObjectKeyFromObject(&r), &cur); err != nil {
		t.Fatal(err)
	}
	t.Logf("idle unload: %+v", *cur.Status.LastUnload)
	if cur.Status.LastUnload.Reason == "" || cur.Status.LastUnload.FreedBytes < 0 {
		t.Errorf("lastUnload %+v", *cur.Status.LastUnload)
	}
}

func TestNodeCredentialCannotTouchAnotherMac(t *testing.T) {
	agents := fleet.Agents()
	a, b := fleet.Agent(localfleetNode(0)), fleet.Agent(localfleetNode(1))
	if a == nil || b == nil || len(agents) < 2 {
		t.Fatalf("need two agents, have %v", agents)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", a.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: fleet.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var other v1alpha1.MacNode
	if err := fleet.Client.Get(t.Context(), client.ObjectKey{Name: b.Node.Name}, &other); err != nil {
		t.Fatal(err)
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"stolen":"yes"}}}`))
	err = c.Patch(t.Context(), &other, patch)
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s patching MacNode %s: %v, want 403 Forbidden", a.Node.Name, b.Node.Name, err)
	}
	err = c.Status().Patch(t.Context(), &other, client.RawPatch(types.MergePatchType, []byte(`{"status":{"memory":{"pressure":"Emergency"}}}`)))
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s patching MacNode %s's status: %v, want 403 Forbidden", a.Node.Name, b.Node.Name, err)
	}
	var own v1alpha1.MacNode
	if err := c.Get(t.Context(), client.ObjectKey{Name: a.Node.Name}, &own); err != nil {
		t.Errorf("%s reading its own MacNode: %v", a.Node.Name, err)
	}
}

func localfleetNode(i int) string { return localfleet.DefaultNodes[i].Name }

func TestServingSurvivesAPIServerOutage(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "outage", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.Strategy = v1alpha1.Spread
	}))
	waitReady(t, ns, "outage", 2, 3*time.Minute)
	addrs := sliceAddresses(t, ns, "outage", 2)

	l := startLoad(t.Context(), "outage", 2)
	fleet.CutAPIServer()
	cutAt := time.Now()
	restored := false
	defer func() {
		if !restored {
			_ = fleet.RestoreAPIServer()
		}
	}()
	// 30 s without the API server: the gateway routes from what it knows, the
	// agents serve from their pools.
	deadline := cutAt.Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, addr := range addrs {
			if _, err := chat(t.Context(), openaiDirect(addr), "outage", false); err != nil {
				t.Errorf("%.0fs into the outage, agent %s: %v", time.Since(cutAt).Seconds(), addr, err)
			}
		}
	}
	served := l.ok.Load()
	if err := fleet.RestoreAPIServer(); err != nil {
		t.Fatal(err)
	}
	restored = true
	restoredAt := time.Now()
	ok, errs := l.finish()
	if len(errs) > 0 {
		t.Errorf("%d of %d gateway requests failed during the outage; first: %v", len(errs), ok+int64(len(errs)), errs[0])
	}
	if served == 0 {
		t.Errorf("no request through the gateway was served during the outage")
	}
	t.Logf("during a 30 s outage: %d requests through the gateway", served)

	// Back in touch: the agents renew their Leases and report again, and the fleet
	// still takes changes.
	for _, a := range fleet.Agents() {
		if err := fleet.WaitNodeReady(t.Context(), a.Node.Name); err != nil {
			t.Fatal(err)
		}
	}
	scale(t, ns, "outage", 1)
	waitReady(t, ns, "outage", 1, 2*time.Minute)

	// No Mac was called lost for not renewing its Lease while nobody could: once every
	// agent has renewed after the outage, each MacNode has been Ready since before the
	// cut (the manager lost the API server too, and gives every agent a lease duration
	// after it returns).
	for _, a := range fleet.Agents() {
		name := a.Node.Name
		testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
			var lease coordinationv1.Lease
			if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeLeaseNamespace, Name: name}, &lease); err != nil {
				return false, err.Error()
			}
			rt := lease.Spec.RenewTime
			return rt != nil && rt.After(restoredAt), fmt.Sprintf("Lease of %s last renewed %v, before the API server returned", name, rt)
		})
		var n v1alpha1.MacNode
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		c := meta.FindStatusCondition(n.Status.Conditions, v1alpha1.MacNodeReady)
		if c == nil || c.Status != metav1.ConditionTrue || !c.LastTransitionTime.Time.Before(cutAt) {
			t.Errorf("MacNode %s Ready condition %+v: it changed during or after the outage (cut at %s)", name, c,
				cutAt.UTC().Format(time.RFC3339Nano))
		}
	}
}

// openaiDirect is an OpenAI client that calls one agent as a gateway does (its client
// certificate).
func openaiDirect(addr string) openai.Client {
	return openai.NewClient(option.WithBaseURL(localfleet.AgentURL(addr)+"/v1/"), option.WithHTTPClient(fleet.AgentHTTP),
		option.WithMaxRetries(0))
}

func TestAgentRestartAdoptsRunners(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	name := localfleetNode(0)
	create(t, deployment(ns, "adopted", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.Strategy = v1alpha1.Spread
	}))
	replicas := waitReady(t, ns, "adopted", 2, 3*time.Minute)
	var key string
	for _, r := range replicas {
		if r.Spec.NodeName == name {
			key = r.Namespace + "/" + r.Name
		}
	}
	addr := fleet.Agent(name).Addr
	before := runnerPIDs(t, addr)[key]
	if key == "" || before == 0 {
		t.Fatalf("no runner for a replica on %s: %v", name, runnerPIDs(t, addr))
	}

	// A crash: the agent dies, its runners keep running; the next agent adopts them.
	if err := fleet.KillAgent(name); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	if err := fleet.StartAgent(name); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		pids, err := runnerPIDsErr(t.Context(), addr)
		return err == nil && pids[key] != 0, fmt.Sprintf("the restarted agent's runners: %v (%v)", pids, err)
	})
	after := runnerPIDs(t, addr)[key]
	if after != before {
		t.Errorf("after a restart the replica's runner is PID %v, before PID %v: it was reloaded, not adopted", after, before)
	}
	if _, err := chat(t.Context(), openaiDirect(addr), "adopted", true); err != nil {
		t.Errorf("chat to the restarted agent: %v", err)
	}
	t.Logf("restarted agent serving its adopted runner %.1fs after the restart", time.Since(restarted).Seconds())
	if err := fleet.WaitNodeReady(t.Context(), name); err != nil {
		t.Fatal(err)
	}
}

func TestNodeLossMovesReplicas(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	lost, survivor := localfleetNode(1), localfleetNode(0)
	// One replica per Mac: a replica waits for a Mac the scheduler does not see as
	// Ready yet (the previous test restarted an agent) instead of doubling up on the
	// other one.
	create(t, deployment(ns, "moving", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.Strategy = v1alpha1.Spread
		md.Spec.Placement.MaxReplicasPerNode = 1
		md.Spec.Engine.Parallel = 1
	}))
	replicas := waitReady(t, ns, "moving", 2, 3*time.Minute)
	// The replacement must fit next to the survivor's replica. Placement is not part of
	// the replica template: this rolls nothing.
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"placement":{"maxReplicasPerNode":2}}}`))
	if err := fleet.Client.Patch(t.Context(), &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "moving"}}, patch); err != nil {
		t.Fatal(err)
	}
	placed := func(rs []v1alpha1.ModelReplica) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Name+"@"+r.Spec.NodeName)
		}
		slices.Sort(out)
		return out
	}
	if again := waitReady(t, ns, "moving", 2, time.Minute); !slices.Equal(placed(again), placed(replicas)) {
		t.Fatalf("raising maxReplicasPerNode changed the replicas:%s\nbefore:%s", describeReplicas(again), describeReplicas(replicas))
	}
	// The gateway routes it before the loss. The earlier test cut the fleet off the
	// API server; the informers retry every 0.6–0.9 s while it is unreachable
	// (internal/informers), so they know a new deployment about a second after it
	// returns. Without that, client-go's reconnect backoff left them blind for up to a
	// minute: 15 s tells the two apart on a loaded machine.
	known := time.Now()
	testenv.Eventually(t, 15*time.Second, 200*time.Millisecond, func() (bool, string) {
		_, err := chat(t.Context(), gatewayClient(), "moving", false)
		return err == nil, fmt.Sprintf("chat through the gateway: %v", err)
	})
	if d := time.Since(known); d > time.Second {
		t.Logf("the gateway routed the new deployment %.1fs after it was Ready", d.Seconds())
	}
	var onLost string
	for _, r := range replicas {
		if r.Spec.NodeName == lost {
			onLost = r.Name
		}
	}
	if onLost == "" {
		t.Fatalf("no replica on %s: %s", lost, describeReplicas(replicas))
	}
	lostAddr := fleet.Agent(lost).Addr
	// The EndpointSlice lists the Mac as a ready endpoint before the loss, or the check
	// below would pass on a slice that is merely behind.
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		addrs := readySliceAddresses(t, ns, "moving")
		return slices.Contains(addrs, lostAddr), fmt.Sprintf("ready endpoints %v, want %s among them", addrs, lostAddr)
	})

	if err := fleet.KillAgent(lost); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The Lease the dead agent renewed last says when the Mac counts as lost.
	var lease coordinationv1.Lease
	if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeLeaseNamespace, Name: lost}, &lease); err != nil {
		t.Fatal(err)
	}
	expiry := lease.Spec.RenewTime.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second)
	defer func() {
		if err := fleet.StartAgent(lost); err != nil {
			t.Error(err)
		}
		if err := fleet.WaitNodeReady(context.WithoutCancel(t.Context()), lost); err != nil {
			t.Error(err)
		}
	}()
	// Within the lease duration (plus the controller's reaction) the lost Mac's
	// endpoint is no longer ready.
	testenv.Eventually(t, leaseDuration+5*time.Second, 100*time.Millisecond, func() (bool, string) {
		for _, a := range readySliceAddresses(t, ns, "moving") {
			if a == lostAddr {
				return false, "the lost Mac " + lostAddr + " is still a ready endpoint"
			}
		}
		return true, ""
	})
	notReadyAfter := time.Since(killed)
	// The deployment stops counting the lost Mac's replica (Ready=Unknown,
	// NodeUnreachable) while it waits out the grace period.
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "moving"}, &md); err != nil {
			return false, err.Error()
		}
		return md.Status.ReadyReplicas == 1, fmt.Sprintf("readyReplicas %d, want 1 while %s is lost", md.Status.ReadyReplicas, lost)
	})
	// After the grace period the lost Mac's replica is deleted and replaced on the
	// surviving Mac (the replica on the dead Mac still says Ready: nobody is left to
	// say otherwise, as with a Pod on a lost kubelet).
	var recovered time.Duration
	testenv.Eventually(t, leaseDuration+nodeLossGrace+2*time.Minute, 100*time.Millisecond, func() (bool, string) {
		var list v1alpha1.ModelReplicaList
		if err := fleet.Client.List(t.Context(), &list, client.InNamespace(ns),
			client.MatchingLabels{v1alpha1.LabelDeployment: "moving"}); err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, r := range list.Items {
			if r.Spec.NodeName == survivor && conditionTrue(r.Status.Conditions, v1alpha1.ReplicaReady) {
				ready++
			}
		}
		recovered = time.Since(killed)
		return ready == 2 && len(list.Items) == 2, "both replicas Ready on " + survivor + ":" + describeReplicas(list.Items)
	})
	if recovered < leaseDuration+nodeLossGrace-5*time.Second {
		t.Errorf("replicas moved %.1fs after the agent died, before the lease (%s) and grace (%s) ran out",
			recovered.Seconds(), leaseDuration, nodeLossGrace)
	}
	if _, err := chat(t.Context(), gatewayClient(), "moving", true); err != nil {
		t.Errorf("chat after recovery: %v", err)
	}
	t.Logf("node loss (lease %s, grace %s): after the kill, endpoint not ready in %.1fs, replacement Ready in %.1fs; "+
		"after the Lease expired, endpoint not ready in %.2fs, replacement Ready in %.2fs",
		leaseDuration, nodeLossGrace, notReadyAfter.Seconds(), recovered.Seconds(),
		killed.Add(notReadyAfter).Sub(expiry).Seconds(), killed.Add(recovered).Sub(expiry).Seconds())
}

package manager_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/cmd/macfleet/manager"
	"github.com/macfleet/macfleet/controllers/certsigner/certsignertest"
	"github.com/macfleet/macfleet/internal/nodeauthz"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, &env, testenv.WithScheme(mfv1.AddToScheme))
}

// loopback is a listener on a port of its own for the manager to serve: the port is
// never free between choosing it and serving it.
func loopback(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestControlPlaneWiring runs the manager exactly as `macfleet manager` does and walks
// one deployment through its life with the test playing the node agent: create →
// bound → Ready → Service and EndpointSlice → Lease expires → endpoint not ready →
// replica rescheduled (and unschedulable, as the only Mac is gone).
func TestControlPlaneWiring(t *testing.T) {
	c := env.Client
	ctx := t.Context()
	metricsLn, probeLn := loopback(t), loopback(t)
	metricsAddr, probeAddr := metricsLn.Addr().String(), probeLn.Addr().String()
	startManager(t, manager.Config{
		RestConfig:       env.Config,
		MetricsListener:  metricsLn,
		ProbeListener:    probeLn,
		NodeLossGrace:    2 * time.Second,
		SchedulerWorkers: 2,
	})

	// The agent's part: a Mac with a ceiling, a Ready condition and a fresh Lease, at an
	// address where it serves TLS with its certificate from the fleet CA (the endpoints
	// controller publishes no address it has not proven; the API server refuses
	// loopback addresses in EndpointSlices).
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mfv1.NodeLeaseNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// Like an agent: renew the Lease first, then register the Mac and report it Ready.
	ns := testenv.NewNamespace(t, c)
	node := &mfv1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: "mac-" + ns}}
	agentAddr := serveAgentTLS(t, c, node.Name)
	agentHost, agentPort, _ := net.SplitHostPort(agentAddr)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.NodeLeaseNamespace, Name: node.Name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(node.Name),
			LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		},
	}
	if err := c.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), node) })
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return err
		}
		node.Status.Agent.Address = agentAddr
		node.Status.Memory.Ceiling = ptr.To(resource.MustParse("16Gi"))
		meta.SetStatusCondition(&node.Status.Conditions, metav1.Condition{Type: mfv1.MacNodeReady, Status: metav1.ConditionTrue, Reason: mfv1.ReasonAgentReady})
		return c.Status().Update(ctx, node)
	}); err != nil {
		t.Fatal(err)
	}

	allowModelsExample(t, c)
	md := &mfv1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "chat"},
		Spec: mfv1.ModelDeploymentSpec{
			Model:     mfv1.ModelSource{Source: "https://models.example/chat.gguf"},
			Resources: &mfv1.ModelResources{Memory: ptr.To(resource.MustParse("2Gi"))},
		},
	}
	if err := c.Create(ctx, md); err != nil {
		t.Fatal(err)
	}

	checkPreflightEvent(t)

	// The deployment controller creates a replica and the scheduler binds it.
	var replica mfv1.ModelReplica
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		var list mfv1.ModelReplicaList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		if len(list.Items) != 1 || list.Items[0].Spec.NodeName != node.Name {
			return false, fmt.Sprintf("replicas: %+v", names(list.Items))
		}
		replica = list.Items[0]
		return true, ""
	})

	// The agent reports the replica Ready.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(&replica), &replica); err != nil {
			return err
		}
		meta.SetStatusCondition(&replica.Status.Conditions, metav1.Condition{Type: mfv1.ReplicaReady, Status: metav1.ConditionTrue, Reason: mfv1.ReasonRunnerReady})
		replica.Status.Endpoint = node.Status.Agent.Address
		return c.Status().Update(ctx, &replica)
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
			return false, err.Error()
		}
		return md.Status.ReadyReplicas == 1 && meta.IsStatusConditionTrue(md.Status.Conditions, mfv1.DeploymentAvailable),
			fmt.Sprintf("status: %+v", md.Status)
	})
	var svc corev1.Service
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: md.Name}, &svc)
		return err == nil, fmt.Sprint(err)
	})
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8080 || svc.Spec.Selector != nil {
		t.Errorf("service: ports %+v selector %v, want one port 8080 and no selector", svc.Spec.Ports, svc.Spec.Selector)
	}
	endpointReady := func() (*bool, string) {
		var slices discoveryv1.EndpointSliceList
		if err := c.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: md.Name}); err != nil {
			return nil, err.Error()
		}
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if len(e.Addresses) == 1 && e.Addresses[0] == agentHost && len(s.Ports) == 1 && fmt.Sprint(*s.Ports[0].Port) == agentPort {
					return e.Conditions.Ready, ""
				}
			}
		}
		return nil, fmt.Sprintf("no endpoint %s in %d slices", agentAddr, len(slices.Items))
	}
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		r, msg := endpointReady()
		return r != nil && *r, "endpoint not ready: " + msg
	})

	// The agent dies: its Lease expires. The node goes Unknown, the endpoint not ready,
	// and after the grace period the replica is replaced by one that cannot be placed.
	lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Hour)}
	if err := c.Update(ctx, lease); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return false, err.Error()
		}
		cond := meta.FindStatusCondition(node.Status.Conditions, mfv1.MacNodeReady)
		return cond != nil && cond.Status == metav1.ConditionUnknown, fmt.Sprintf("Ready: %+v", cond)
	})
	// Not routed any more: listed as not ready, or gone with the replica's Ready
	// (Unknown while its Mac is lost).
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		r, msg := endpointReady()
		return r == nil || !*r, "endpoint still ready: " + msg
	})
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
			return false, err.Error()
		}
		cond := meta.FindStatusCondition(md.Status.Conditions, mfv1.DeploymentScheduled)
		return cond != nil && cond.Status == metav1.ConditionFalse && strings.Contains(cond.Message, "0/1 Macs fit") &&
			strings.Contains(cond.Message, "not ready"), fmt.Sprintf("Scheduled: %+v", cond)
	})
	if err := c.Get(ctx, client.ObjectKeyFromObject(&replica), &mfv1.ModelReplica{}); !apierrors.IsNotFound(err) {
		t.Errorf("replica on the lost Mac: got %v, want NotFound", err)
	}

	// Probes and metrics are served, and the scheduler's metrics are registered.
	for _, u := range []string{"http://" + probeAddr + "/healthz", "http://" + probeAddr + "/readyz"} {
		if body, code := get(t, u); code != http.StatusOK {
			t.Errorf("GET %s: %d %s", u, code, body)
		}
	}
	body, code := get(t, "http://"+metricsAddr+"/metrics")
	for _, m := range []string{"macfleet_scheduler_bindings_total", "macfleet_scheduler_unschedulable_replicas", "controller_runtime_reconcile_total"} {
		if code != http.StatusOK || !strings.Contains(body, m) {
			t.Errorf("GET /metrics (%d) lacks %s", code, m)
		}
	}
}

// serveAgentTLS plays the TLS side of the agent of node until the test ends: it waits
// for the manager's fleet CA (in macfleet-system, created here), serves handshakes with a certificate of it for node on
// this machine's first non-loopback address, and returns that host:port.
func serveAgentTLS(t *testing.T, c client.Client, node string) string {
	t.Helper()
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mfv1.SystemNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var sec corev1.Secret
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		err := c.Get(t.Context(), client.ObjectKey{Namespace: mfv1.SystemNamespace, Name: mfv1.CASecret}, &sec)
		return err == nil && len(sec.Data["ca.crt"]) > 0, fmt.Sprintf("the fleet CA Secret: %v", err)
	})
	ca, err := pki.ParseCA(sec.Data["ca.crt"], sec.Data["ca.key"])
	if err != nil {
		t.Fatal(err)
	}
	id := pki.Node(node)
	src, err := ca.NewSource(&id, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	host, err := localfleet.HostIP()
	if err != nil {
		t.Fatal(err)
	}
	return certsignertest.ServeTLS(t, src, host)
}

func get(t *testing.T, url string) (string, int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

func names(rs []mfv1.ModelReplica) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name+"@"+r.Spec.NodeName)
	}
	return out
}

// allowModelsExample makes the cluster's SourcePolicy allow every namespace the
// https://models.example sources the tests' deployments use.
func allowModelsExample(t *testing.T, c client.Client) {
	t.Helper()
	if err := c.Create(t.Context(), &mfv1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: mfv1.SourcePolicyName},
		Spec: mfv1.SourcePolicySpec{Rules: []mfv1.SourcePolicyRule{{Namespaces: []string{"*"}, Hosts: []string{"models.example"}}}}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// startManager builds the manager from cfg as `macfleet manager` does and runs it until
// the test ends. (-count=N builds the manager N times in one process: names are not
// checked for uniqueness.)
func startManager(t *testing.T, cfg manager.Config) {
	t.Helper()
	cfg.SkipNameValidation = true
	mgr, err := manager.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mgrCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// TestNodeAuthorizerNeedsCertificate: serving the node authorizer without a certificate
// is refused at start, naming the flag to set.
func TestNodeAuthorizerNeedsCertificate(t *testing.T) {
	_, err := manager.New(manager.Config{RestConfig: env.Config, NodeAuthorizerListener: loopback(t), SkipNameValidation: true})
	if err == nil || !strings.Contains(err.Error(), "--node-authorizer-cert-dir") {
		t.Errorf("New without a certificate directory: %v, want an error naming --node-authorizer-cert-dir", err)
	}
	_, err = manager.New(manager.Config{RestConfig: env.Config, NodeAuthorizerListener: loopback(t), NodeAuthorizerCertDir: t.TempDir(),
		SkipNameValidation: true})
	if err == nil || !strings.Contains(err.Error(), "tls.crt") {
		t.Errorf("New with an empty certificate directory: %v, want an error naming tls.crt", err)
	}
}

// checkPreflightEvent: the manager names the node authorization mode in force — the one
// the API server's answers show — in an Event on its Deployment.
func checkPreflightEvent(t *testing.T) {
	t.Helper()
	want, err := nodeauthz.Preflight(t.Context(), kubernetes.NewForConfigOrDie(env.Config))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		var events eventsv1.EventList
		if err := env.Client.List(t.Context(), &events, client.InNamespace(mfv1.SystemNamespace)); err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Reason == nodeauthz.ReasonNodeAuthorization && e.Regarding.Kind == "Deployment" && e.Regarding.Name == "macfleet-manager" &&
				strings.Contains(e.Note, "node authorization in force: "+string(want)+" ") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no %s Event naming mode %s on Deployment macfleet-manager among %d", nodeauthz.ReasonNodeAuthorization, want, len(events.Items))
	})
}

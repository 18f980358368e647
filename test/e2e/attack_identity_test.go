package e2e

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/certs"
	"github.com/macfleet/macfleet/agent/clustermode"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/callercert"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The attacks on the callers of an agent (docs/security.md, "1. Callers of an
// agent"): what a compromised Mac, a sniffer on the LAN and a lying status.endpoint
// get from the agents.

// compromisedMac is what an attacker who took the Mac node holds: its node credential
// (the kubeconfig the agent runs with) and the agent's key (in its state directory),
// with which it gets the agent's certificate as the agent does (a
// CertificateSigningRequest the manager signs for the key pinned to the Mac).
type compromisedMac struct {
	node      string
	clientset kubernetes.Interface
	// agents calls agents with the Mac's own certificate.
	agents *http.Client
}

func takeMac(t *testing.T, node string) compromisedMac {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", fleet.Agent(node).Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(clustermode.KeyFile(fleet.Agent(node).StateDir))
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParseKey(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := certs.Ask(t.Context(), cs, node, key, "", pki.DefaultLeafLifetime, time.Minute)
	if err != nil {
		t.Fatalf("the Mac %s's own key got no certificate: %v", node, err)
	}
	src := &pki.Source{}
	if err := src.SetCertificate(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	hc, err := fleet.AgentClientWith(t.Context(), src.Certificate())
	if err != nil {
		t.Fatal(err)
	}
	return compromisedMac{node: node, clientset: cs, agents: hc}
}

// readsFleetToken: the Mac's credential reads the fleet token, if there is one it may.
func (m compromisedMac) readsFleetToken(t *testing.T) bool {
	t.Helper()
	s, err := m.clientset.CoreV1().Secrets(v1alpha1.SystemNamespace).Get(t.Context(), v1alpha1.FleetTokenSecret, metav1.GetOptions{})
	return err == nil && len(s.Data[v1alpha1.FleetTokenKey]) > 0
}

// otherMac is the simulated Mac that is not node.
func otherMac(node string) string {
	if node == localfleetNode(0) {
		return localfleetNode(1)
	}
	return localfleetNode(0)
}

// do sends a request to an agent with hc and returns the status and body.
func do(t *testing.T, hc *http.Client, method, u, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAttackMacUnloadsAnotherMacsModel: a compromised Mac tries to unload a tenant's
// model on another Mac through its admin API and to chat with the tenant's replica
// without a key, with every credential it holds; it must get 403 (its certificate),
// no fleet token to read, and the model stays loaded and served.
func TestAttackMacUnloadsAnotherMacsModel(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "victim", 1))
	replicas := waitReady(t, ns, "victim", 1, 3*time.Minute)
	victim := replicas[0]
	attacker := takeMac(t, otherMac(victim.Spec.NodeName))
	agent := localfleet.AgentURL(victim.Status.Endpoint)
	key := victim.Namespace + "/" + victim.Name

	if attacker.readsFleetToken(t) {
		t.Errorf("the node credential of %s reads the fleet token", attacker.node)
	}
	for _, a := range []struct{ method, path, body string }{
		{http.MethodPost, "/api/models/" + url.PathEscape(key) + "/unload", ""},
		{http.MethodPost, "/api/cache/clear", ""},
		{http.MethodGet, "/api/status", ""},
		{http.MethodPost, "/v1/chat/completions", chatBody(key)},
	} {
		code, body := do(t, attacker.agents, a.method, agent+a.path, a.body, v1alpha1.HeaderReplica, key)
		if code != http.StatusForbidden || !strings.Contains(body, "forbidden_caller") {
			t.Errorf("%s's certificate on %s's agent, %s %s: %d %s; want 403 forbidden_caller",
				attacker.node, victim.Spec.NodeName, a.method, a.path, code, body)
		}
	}
	// Without a certificate, and with no key: nothing either.
	code, body := call(t, agent, http.MethodPost, "/v1/chat/completions", "", chatBody(key), v1alpha1.HeaderReplica, key)
	if code != http.StatusUnauthorized {
		t.Errorf("chat on %s's agent without a credential: %d %s; want 401", victim.Spec.NodeName, code, body)
	}
	// The model is still loaded: the gateway's certificate is served by it.
	if code, body := call(t, agent, http.MethodPost, "/v1/chat/completions", asGateway, chatBody(key), v1alpha1.HeaderReplica, key); code != http.StatusOK {
		t.Errorf("the victim's replica after the attempts: %d %s; want it still served", code, body)
	}
}

// TestAttackForgedQueueReportsScaleUp: a compromised Mac, and a tenant's workload with
// its own ServiceAccount token, send X-Macfleet-Queued: 1000, and an
// X-Macfleet-Queued-Seconds that grows by a million each report, to the agent of an
// autoscaled deployment's replica to push it to maxReplicas; the Mac must get 403,
// the tenant's report must be ignored, and the deployment must stay at its minimum.
func TestAttackForgedQueueReportsScaleUp(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"}})
	create(t, deployment(ns, "elastic", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Replicas = nil
		md.Spec.Placement.MaxReplicasPerNode = 2
		md.Spec.Autoscaling = &v1alpha1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: 2,
			TargetInFlight: ptr.To[int32](1), StabilizationWindow: &metav1.Duration{}}
	}))
	replicas := waitReady(t, ns, "elastic", 1, 3*time.Minute)
	r := replicas[0]
	attacker := takeMac(t, otherMac(r.Spec.NodeName))
	tenant := serviceAccountToken(t, ns, "app", satoken.DefaultAudience)
	agent := localfleet.AgentURL(r.Status.Endpoint)
	key := r.Namespace + "/" + r.Name
	// The count and the integral over time the autoscaler takes a mean of: a thousand
	// waiting, and a million request-seconds more every report.
	area := 0

	// Forge for three autoscaler intervals (5 s each) past the reports' 10 s life, at
	// the attacker's pace of two reports a second.
	pace := time.NewTicker(500 * time.Millisecond)
	defer pace.Stop()
	for until := time.Now().Add(25 * time.Second); time.Now().Before(until); <-pace.C {
		area += 1_000_000
		forged := []string{v1alpha1.HeaderQueued, "1000", v1alpha1.HeaderGateway, "forged",
			v1alpha1.HeaderQueuedSeconds, strconv.Itoa(area)}
		if code, body := do(t, attacker.agents, http.MethodPost, agent+"/v1/chat/completions", chatBody(key),
			append(forged, v1alpha1.HeaderReplica, key)...); code != http.StatusForbidden {
			t.Fatalf("%s's forged queue report: %d %s; want 403", attacker.node, code, body)
		}
		if code, body := call(t, agent, http.MethodPost, "/v1/chat/completions", tenant, chatBody("elastic"), forged...); code != http.StatusOK {
			t.Fatalf("the tenant's request with a forged queue report: %d %s; want it served, its report ignored", code, body)
		}
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "elastic"}, &md); err != nil {
			t.Fatal(err)
		}
		if n := ptr.Deref(md.Spec.Replicas, 0); n != 1 {
			t.Fatalf("the forged queue reports scaled the deployment to %d replicas (autoscaling %+v)", n, md.Status.Autoscaling)
		}
	}
	// The autoscaler measured the agent all along (over mTLS): within target, not
	// LoadUnknown.
	var md v1alpha1.ModelDeployment
	if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "elastic"}, &md); err != nil {
		t.Fatal(err)
	}
	if a := md.Status.Autoscaling; a == nil || a.Reason != v1alpha1.ReasonWithinTarget {
		t.Errorf("status.autoscaling %+v; want the autoscaler reading the agent's load (WithinTarget)", a)
	}
}

// recorder is a TCP relay (or, without a target, a listener) that keeps every byte
// it sees in either direction: a sniffer or an attacker on the path.
type recorder struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	seen   bytes.Buffer
	wg     sync.WaitGroup
}

func newRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(fleet.HostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); r.wg.Wait() })
	r.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Go(func() { r.serve(c) })
		}
	})
	return r
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen.Write(p)
}

func (r *recorder) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if r.target == "" {
		_, _ = io.Copy(r, c)
		return
	}
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(io.MultiWriter(up, r), c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(io.MultiWriter(c, r), up); done <- struct{}{} }()
	<-done
}

func (r *recorder) addr() string { return r.ln.Addr().String() }

func (r *recorder) saw(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Contains(r.seen.Bytes(), []byte(s))
}

// pathGateway runs the gateway's own code in this process, with the gateway's
// certificate from its Secret, over a table in which the replica of ns/name is
// reached at endpoint instead of its status.endpoint (as if the network, or a lying
// status, sent its traffic there). It returns the gateway's URL and its log.
func pathGateway(t *testing.T, ns, name, endpoint string) (string, *strings.Builder) {
	t.Helper()
	ctx := t.Context()
	src := &pki.Source{}
	cs := kubernetes.NewForConfigOrDie(fleet.Env.Config)
	if err := callercert.Load(ctx, cs, v1alpha1.SystemNamespace, v1alpha1.GatewayTLSSecret, src); err != nil {
		t.Fatal(err)
	}
	var mds v1alpha1.ModelDeploymentList
	var rs v1alpha1.ModelReplicaList
	var nodes v1alpha1.MacNodeList
	for _, l := range []client.ObjectList{&mds, &rs} {
		if err := fleet.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
	}
	if err := fleet.Client.List(ctx, &nodes); err != nil {
		t.Fatal(err)
	}
	for i := range rs.Items {
		if rs.Items[i].Labels[v1alpha1.LabelDeployment] == name {
			rs.Items[i].Status.Endpoint = endpoint
		}
	}
	var mu sync.Mutex
	logs := &strings.Builder{}
	log := funcr.New(func(prefix, args string) { mu.Lock(); fmt.Fprintln(logs, prefix, args); mu.Unlock() }, funcr.Options{Verbosity: 4})
	g, err := gateway.New(gateway.Options{AgentCertificates: src, ColdStartTimeout: 3 * time.Second, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	g.SetTable(gateway.BuildTable(mds.Items, rs.Items, nodes.Items))
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return srv.URL, logs
}

// TestAttackSnifferOnTheLAN: a sniffer between the gateway and an agent reads the
// prompts, answers and credentials on the wire, and a LAN host calls the agent over
// plain HTTP; the sniffer must see no plaintext of either, plain HTTP must get no
// answer, and the request must still be served through it.
func TestAttackSnifferOnTheLAN(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "chat", 1))
	r := waitReady(t, ns, "chat", 1, 3*time.Minute)[0]
	sniffer := newRecorder(t, r.Status.Endpoint)
	gw, logs := pathGateway(t, ns, "chat", sniffer.addr())
	const secret = "the launch code is 7741"
	body := `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"` + secret + `"}]}`
	if code, text := do(t, http.DefaultClient, http.MethodPost, gw+"/v1/chat/completions", body); code != http.StatusOK {
		t.Fatalf("a chat through the sniffed path: %d %s\n%s", code, text, logs)
	}
	for _, s := range []string{secret, "chat/completions", "Authorization", v1alpha1.HeaderReplica, "choices"} {
		if sniffer.saw(s) {
			t.Errorf("the sniffer read %q on the wire between the gateway and the agent", s)
		}
	}
	if !sniffer.saw("\x16\x03") {
		t.Error("the sniffer saw no TLS record: the traffic did not pass it")
	}
	code, text := do(t, http.DefaultClient, http.MethodPost, "http://"+r.Status.Endpoint+"/v1/chat/completions", body)
	if code == http.StatusOK || strings.Contains(text, "choices") {
		t.Errorf("plain HTTP to the agent: %d %s; want no answer", code, text)
	}
}

// TestAttackEndpointPointsElsewhere: a replica's endpoint points at another Mac, at a
// host that answers plain HTTP, or at an attacker's TLS listener with a certificate of
// its own CA naming the replica's Mac; the gateway must send none of them the request
// or a credential (no plaintext, no completed handshake with its client certificate),
// and the request must fail rather than be answered by the wrong host.
func TestAttackEndpointPointsElsewhere(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "chat", 1))
	r := waitReady(t, ns, "chat", 1, 3*time.Minute)[0]
	body := chatBody("chat")

	// Another Mac of the fleet.
	other := fleet.Agent(otherMac(r.Spec.NodeName)).Addr
	gw, logs := pathGateway(t, ns, "chat", other)
	if code, text := do(t, http.DefaultClient, http.MethodPost, gw+"/v1/chat/completions", body); code == http.StatusOK {
		t.Errorf("the request was answered at another Mac's address: %s", text)
	}
	if want := "not " + pki.Node(r.Spec.NodeName).String(); !strings.Contains(logs.String(), want) {
		t.Errorf("the gateway did not refuse the other Mac's certificate (no %q in its log):\n%s", want, logs)
	}

	// A plain listener: it reads what is sent.
	plain := newRecorder(t, "")
	gw, _ = pathGateway(t, ns, "chat", plain.addr())
	if code, text := do(t, http.DefaultClient, http.MethodPost, gw+"/v1/chat/completions", body); code == http.StatusOK {
		t.Errorf("the request was answered by a plain listener: %s", text)
	}
	for _, s := range []string{"Authorization", "Bearer", "chat/completions"} {
		if plain.saw(s) {
			t.Errorf("the attacker's plain listener read %q", s)
		}
	}

	// A TLS listener with a certificate of its own CA that names the replica's Mac.
	rogue, err := pki.NewCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := pki.NewKey()
	leaf, err := rogue.Issue(key.Public(), pki.Node(r.Spec.NodeName), time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var handshakes, clientCerts int
	ln, err := tls.Listen("tcp", net.JoinHostPort(fleet.HostIP, "0"), &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}},
		ClientAuth:   tls.RequestClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			mu.Lock()
			defer mu.Unlock()
			handshakes++
			clientCerts += len(cs.PeerCertificates)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := &recorder{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(seen, "%s %v", r.URL, r.Header)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"from the attacker"}}]}`)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	gw, _ = pathGateway(t, ns, "chat", ln.Addr().String())
	if code, text := do(t, http.DefaultClient, http.MethodPost, gw+"/v1/chat/completions", body); code == http.StatusOK {
		t.Errorf("the attacker's TLS listener answered: %s", text)
	}
	mu.Lock()
	defer mu.Unlock()
	if handshakes != 0 || clientCerts != 0 || seen.saw("chat") {
		t.Errorf("the attacker's TLS listener completed %d handshakes, got %d client certificates, saw a request: %t",
			handshakes, clientCerts, seen.saw("chat"))
	}
}

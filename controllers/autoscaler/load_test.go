package autoscaler

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// fakeAgent serves /api/status with the agent's own response type, requiring the
// fleet token, and counts the reads.
type fakeAgent struct {
	srv    *httptest.Server
	reads  atomic.Int32
	time   time.Time // the snapshot's time
	models []enginepool.ModelSnapshot
	queues map[string][]server.GatewayQueue
}

func newFakeAgent(t *testing.T, token string, models ...enginepool.ModelSnapshot) *fakeAgent {
	a := &fakeAgent{models: models}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.reads.Add(1)
		if r.URL.Path != "/api/status" || r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		writeJSONBody(t, w, server.StatusResponse{Ready: true, Snapshot: enginepool.Snapshot{Time: a.time, Models: a.models},
			GatewayQueues: a.queues})
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *fakeAgent) endpoint() string { return strings.TrimPrefix(a.srv.URL, "http://") }

// replica creates a ModelReplica of the deployment on the Mac node ("": unbound)
// with the endpoint, Ready or not.
func replica(t *testing.T, ns, deployment, name, node, endpoint string, ready bool) {
	t.Helper()
	e := apiServer(t)
	mr := &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.LabelDeployment: deployment}},
		Spec: v1alpha1.ModelReplicaSpec{
			NodeName:          node,
			Template:          v1alpha1.ModelReplicaTemplate{Model: v1alpha1.ModelSource{Source: "hf://org/repo/model.gguf"}},
			TemplateHash:      "h",
			MemoryReservation: resource.MustParse("1Gi"),
		},
	}
	if err := e.Client.Create(t.Context(), mr); err != nil {
		t.Fatalf("creating replica %s: %v", name, err)
	}
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	mr.Status.Endpoint = endpoint
	meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{Type: v1alpha1.ReplicaReady, Status: status, Reason: "Test"})
	if err := e.Client.Status().Update(t.Context(), mr); err != nil {
		t.Fatalf("writing replica %s status: %v", name, err)
	}
}

// TestAgentSource measures a deployment spread over Macs through real HTTP: the
// leases of its Ready replicas are summed (other deployments', not-Ready replicas' and
// those on a Mac that is not Ready or gone are not, and their agents are not asked), the fleet token is sent, one read per Mac serves measurements within
// StatusMaxAge, and an agent that refuses answers with an error naming the replica
// and the agent.
func TestAgentSource(t *testing.T) {
	e := apiServer(t)
	ns := testenv.NewNamespace(t, e.Client)
	const token = "fleet-secret"
	macA := newFakeAgent(t, token,
		enginepool.ModelSnapshot{Name: ns + "/chat-0", Leases: 3},
		enginepool.ModelSnapshot{Name: ns + "/other-0", Leases: 7},
		enginepool.ModelSnapshot{Name: ns + "/chat-5", Leases: 4}) // draining: skipped
	macB := newFakeAgent(t, token,
		enginepool.ModelSnapshot{Name: ns + "/chat-1", Leases: 2},
		enginepool.ModelSnapshot{Name: ns + "/chat-2", Leases: 9}) // not Ready: skipped
	// A third Mac was lost (its Lease expired): its agent does not answer, and its
	// replica, still Ready in its last status, serves nothing new.
	lost := httptest.NewServer(http.NotFoundHandler())
	lost.Close()
	nodeA, nodeLost := macNode(t, ns+"-a", metav1.ConditionTrue), macNode(t, ns+"-lost", metav1.ConditionUnknown)
	replica(t, ns, "chat", "chat-0", nodeA, macA.endpoint(), true)
	replica(t, ns, "chat", "chat-1", "", macB.endpoint(), true)
	replica(t, ns, "chat", "chat-2", "", macB.endpoint(), false)
	replica(t, ns, "chat", "chat-3", nodeLost, strings.TrimPrefix(lost.URL, "http://"), true)
	replica(t, ns, "chat", "chat-4", ns+"-gone", strings.TrimPrefix(lost.URL, "http://"), true) // its MacNode was deleted
	replica(t, ns, "other", "other-0", nodeA, macA.endpoint(), true)
	// The deployment controller is removing chat-5: its requests finish, new ones go
	// elsewhere, so its load is leaving (its agent has not written Ready=False yet).
	replica(t, ns, "chat", "chat-5", nodeA, macA.endpoint(), true)
	draining := &v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "chat-5"}}
	if err := e.Client.Patch(t.Context(), draining, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"drain":"2026-01-01T00:00:00Z"}}`))); err != nil {
		t.Fatalf("draining chat-5: %v", err)
	}

	clk := clocktesting.NewFakeClock(t0)
	src := &AgentSource{Client: e.Client, Token: func() string { return token }, Clock: clk, StatusMaxAge: time.Second}
	md := &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "chat"}}
	other := &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"}}

	got, err := src.Measure(t.Context(), md)
	if err != nil || got != (Load{InFlight: 5}) {
		t.Fatalf("Measure = %+v, %v; want 5 in flight", got, err)
	}
	if got, err := src.Measure(t.Context(), other); err != nil || got != (Load{InFlight: 7}) {
		t.Fatalf("Measure(other) = %+v, %v; want 7 in flight", got, err)
	}
	if a, b := macA.reads.Load(), macB.reads.Load(); a != 1 || b != 1 {
		t.Errorf("status reads within StatusMaxAge: mac-a %d, mac-b %d; want 1 each", a, b)
	}

	macA.models[0].Leases = 0
	clk.Step(2 * time.Second)
	if got, err := src.Measure(t.Context(), md); err != nil || got != (Load{InFlight: 2}) {
		t.Fatalf("Measure after StatusMaxAge = %+v, %v; want 2 in flight", got, err)
	}
	if a := macA.reads.Load(); a != 2 {
		t.Errorf("mac-a read %d times, want a fresh read after StatusMaxAge", a)
	}

	clk.Step(2 * time.Second)
	src.Token = func() string { return "wrong" }
	_, err = src.Measure(t.Context(), md)
	if err == nil || !strings.Contains(err.Error(), "reading the load of replica chat-0 from its agent at "+macA.endpoint()) ||
		!strings.Contains(err.Error(), "401 Unauthorized") {
		t.Errorf("Measure with a wrong token: %v; want an error naming chat-0, its agent and the 401", err)
	}
}

// macNode creates a MacNode with the Ready condition status, deleted when the test ends.
func macNode(t *testing.T, name string, ready metav1.ConditionStatus) string {
	t.Helper()
	e := apiServer(t)
	mn := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := e.Client.Create(t.Context(), mn); err != nil {
		t.Fatalf("creating MacNode %s: %v", name, err)
	}
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), mn) })
	meta.SetStatusCondition(&mn.Status.Conditions, metav1.Condition{Type: v1alpha1.MacNodeReady, Status: ready, Reason: "Test"})
	if err := e.Client.Status().Update(t.Context(), mn); err != nil {
		t.Fatalf("writing MacNode %s status: %v", name, err)
	}
	return name
}

func writeJSONBody(t *testing.T, w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		t.Errorf("encoding: %v", err)
	}
}

// TestAgentSourceGatewayQueues: the requests waiting in the gateways' queues, as the
// agents relay the gateways' reports, are the deployment's Held load: each gateway
// counted once, by its newest report among the deployment's replicas (a gateway reports
// to every replica it sends to), other deployments' queues not at all.
func TestAgentSourceGatewayQueues(t *testing.T) {
	e := apiServer(t)
	ns := testenv.NewNamespace(t, e.Client)
	const token = "fleet-secret"
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	macA := newFakeAgent(t, token, enginepool.ModelSnapshot{Name: ns + "/chat-0", Leases: 2},
		enginepool.ModelSnapshot{Name: ns + "/other-0", Leases: 1})
	macA.queues = map[string][]server.GatewayQueue{
		ns + "/chat-0":  {{Gateway: "g1", Queued: 4, At: at(1)}, {Gateway: "g2", Queued: 1, At: at(1)}},
		ns + "/other-0": {{Gateway: "g1", Queued: 50, At: at(3)}},
	}
	macB := newFakeAgent(t, token, enginepool.ModelSnapshot{Name: ns + "/chat-1", Leases: 2})
	macB.queues = map[string][]server.GatewayQueue{
		ns + "/chat-1": {{Gateway: "g1", Queued: 6, At: at(2)}, {Gateway: "g2", Queued: 3, At: at(0)}},
	}
	replica(t, ns, "chat", "chat-0", "", macA.endpoint(), true)
	replica(t, ns, "chat", "chat-1", "", macB.endpoint(), true)
	replica(t, ns, "other", "other-0", "", macA.endpoint(), true)
	src := &AgentSource{Client: e.Client, Token: func() string { return token }, Clock: clocktesting.NewFakeClock(t0)}
	md := &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "chat"}}
	got, err := src.Measure(t.Context(), md)
	// g1's newest is 6 (mac-b), g2's is 1 (mac-a): 7 held.
	if err != nil || got != (Load{InFlight: 4, Held: 7}) {
		t.Fatalf("Measure = %+v, %v; want 4 in flight and 7 held", got, err)
	}
}

// TestAgentSourceMeans: where the agents report lease-seconds and the gateways queued
// seconds, a measurement is the mean load since the previous read, not the count at
// the read's instant: short requests between two reads count, however few are in
// flight when one is made. Without a previous read of the same engine, or from a
// gateway without the integral, the count stands in.
func TestAgentSourceMeans(t *testing.T) {
	e := apiServer(t)
	ns := testenv.NewNamespace(t, e.Client)
	const token = "fleet-secret"
	loaded := t0.Add(-time.Hour)
	mac := newFakeAgent(t, token, enginepool.ModelSnapshot{Name: ns + "/chat-0", Leases: 1, LeaseSeconds: 100, LoadedAt: loaded})
	mac.time = t0
	mac.queues = map[string][]server.GatewayQueue{ns + "/chat-0": {
		{Gateway: "g1", Queued: 0, QueuedSeconds: ptr.To(50.0), At: t0},
		{Gateway: "g2", Queued: 2, At: t0}, // a gateway without the integral
	}}
	replica(t, ns, "chat", "chat-0", "", mac.endpoint(), true)
	clk := clocktesting.NewFakeClock(t0)
	src := &AgentSource{Client: e.Client, Token: func() string { return token }, Clock: clk, StatusMaxAge: time.Second}
	md := &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "chat"}}
	measure := func(want Load, why string) {
		t.Helper()
		if got, err := src.Measure(t.Context(), md); err != nil || got != want {
			t.Fatalf("%s: Measure = %+v, %v; want %+v", why, got, err, want)
		}
	}
	measure(Load{InFlight: 1, Held: 2}, "the first read: the counts")

	// 2 s later: 15 lease-seconds more (7.5 in flight on average) though none is in
	// flight now; g1 queued 12 request-seconds over the 2 s between its reports
	// (6 waiting on average) though its queue is empty now; g2 says 3.
	clk.Step(2 * time.Second)
	mac.time = t0.Add(2 * time.Second)
	mac.models[0].Leases, mac.models[0].LeaseSeconds = 0, 115
	mac.queues[ns+"/chat-0"] = []server.GatewayQueue{
		{Gateway: "g1", Queued: 0, QueuedSeconds: ptr.To(62.0), At: t0.Add(2 * time.Second)},
		{Gateway: "g2", Queued: 3, At: t0.Add(2 * time.Second)},
	}
	measure(Load{InFlight: 8, Held: 9}, "the means since the previous read (7.5 + 6 + 3)")
	// Within StatusMaxAge the same read and the same reports give the same load.
	measure(Load{InFlight: 8, Held: 9}, "the same read again")

	// The engine was reloaded: a new integral, so the count at the instant.
	clk.Step(2 * time.Second)
	mac.time = t0.Add(4 * time.Second)
	mac.models[0].Leases, mac.models[0].LeaseSeconds, mac.models[0].LoadedAt = 2, 1, t0.Add(3*time.Second)
	measure(Load{InFlight: 2, Held: 9}, "after a reload: the leases now; the gateways' reports unchanged")
}

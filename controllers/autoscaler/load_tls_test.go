package autoscaler

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// tlsSource is a pki.Source with a certificate of ca for id.
func tlsSource(t *testing.T, ca *pki.CA, id pki.Identity) *pki.Source {
	t.Helper()
	src, err := ca.NewSource(&id, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// TestAgentSourceReadsTheMacItMeans: with the manager's certificate the source reads
// an agent over TLS whose certificate names the replica's Mac, presenting the
// manager's identity; a replica of another Mac whose status.endpoint points at that
// agent is not read (the handshake fails before any request), so its load cannot be
// made up by whoever answers at the address.
func TestAgentSourceReadsTheMacItMeans(t *testing.T) {
	e := apiServer(t)
	ns := testenv.NewNamespace(t, e.Client)
	ca, err := pki.NewCA(time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nodeA, nodeB := macNode(t, ns+"-a", metav1.ConditionTrue), macNode(t, ns+"-b", metav1.ConditionTrue)
	var caller atomic.Value
	agent := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := pki.PeerIdentity(r.TLS)
		caller.Store(id)
		writeJSONBody(t, w, server.StatusResponse{Ready: true, Snapshot: enginepool.Snapshot{Models: []enginepool.ModelSnapshot{
			{Name: ns + "/a-0", Leases: 2}, {Name: ns + "/b-0", Leases: 7}}}})
	}))
	agent.Listener = tls.NewListener(agent.Listener, tlsSource(t, ca, pki.Node(nodeA)).ServerConfig())
	agent.Start()
	t.Cleanup(agent.Close)
	endpoint := strings.TrimPrefix(agent.URL, "http://")

	replica(t, ns, "honest", "a-0", nodeA, endpoint, true)
	replica(t, ns, "lying", "b-0", nodeB, endpoint, true)
	src := &AgentSource{Client: e.Client, Certificates: tlsSource(t, ca, pki.Manager("macfleet-manager"))}
	md := func(name string) *v1alpha1.ModelDeployment {
		return &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	load, err := src.Measure(t.Context(), md("honest"))
	if err != nil || load.InFlight != 2 {
		t.Fatalf("the load of the replica on %s: %+v, %v; want 2 in flight", nodeA, load, err)
	}
	if got, _ := caller.Load().(pki.Identity); got != pki.Manager("macfleet-manager") {
		t.Errorf("the agent saw the caller %v, want the manager", got)
	}
	load, err = src.Measure(t.Context(), md("lying"))
	if err == nil || !strings.Contains(err.Error(), "not "+pki.Node(nodeB).String()) {
		t.Fatalf("a replica of %s whose endpoint is %s's agent: %+v, %v; want a refused handshake", nodeB, nodeA, load, err)
	}
}

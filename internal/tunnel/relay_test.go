package tunnel

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/macfleet/macfleet/internal/pki"
)

func TestAdmitRelay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		id      pki.Identity
		hasCert bool
		node    string
		err     string
	}{
		{name: "manager", id: pki.Manager("macfleet-manager"), hasCert: true, node: "mac-a"},
		{name: "another gateway replica", id: pki.Gateway("gw-2"), hasCert: true, node: "mac-a"},
		{name: "a Mac", id: pki.Node("mac-b"), hasCert: true, node: "mac-a", err: "only the manager and the gateway replicas"},
		{name: "no certificate", node: "mac-a", err: "no client certificate"},
		{name: "no Mac", id: pki.Manager("macfleet-manager"), hasCert: true, err: "names no Mac"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := AdmitRelay(tc.id, tc.hasCert, tc.node)
			if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("AdmitRelay = %v; want %q", err, tc.err)
			}
		})
	}
}

// managerClient is the manager's client of the agents with the relay's dial.
func managerClient(r *Relay) *http.Client { return &http.Client{Transport: r.Transports()} }

// TestManagerReadsThroughTheTunnel: the manager reads the agent of a Mac that dials
// out through the gateway's tunnel listener (the agent sees the manager's
// certificate: the TLS is theirs), and a Mac without a tunnel at its address.
func TestManagerReadsThroughTheTunnel(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	startAgent(t, addr, "mac-a", source(t, fc.ca, pki.Node("mac-a")), whoami("mac-a"))
	waitNodes(t, s, "mac-a")
	direct := serveDirect(t, source(t, fc.ca, pki.Node("mac-d")), whoami("mac-d"))

	c := managerClient(&Relay{Gateway: addr, Certificates: source(t, fc.ca, pki.Manager("macfleet-manager"))})
	got, err := get(t.Context(), c, "mac-a", "/api/status")
	if want := "mac-a for macfleet://manager/macfleet-manager"; err != nil || got != want {
		t.Errorf("the manager reading mac-a through the gateway: %q, %v; want %q", got, err, want)
	}
	req, _ := http.NewRequestWithContext(pki.WithNode(t.Context(), "mac-d"), http.MethodGet, "https://"+direct+"/api/status", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("the manager reading mac-d at its address: %v", err)
	}
	resp.Body.Close()
}

// TestAttackTunnelRelayAsAMac: a Mac's certificate asks the gateway's tunnel listener
// for the manager's relay to another Mac, to reach that Mac's agent from the outside:
// refused, and the Mac's agent serves nothing. (A gateway replica's certificate is
// relayed: it reaches every Mac's agent at its address anyway.)
func TestAttackTunnelRelayAsAMac(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	var served atomic.Int32
	startAgent(t, addr, "mac-a", source(t, fc.ca, pki.Node("mac-a")), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		served.Add(1)
	}))
	waitNodes(t, s, "mac-a")
	r := &Relay{Gateway: addr, Certificates: source(t, fc.ca, pki.Node("mac-b"))}
	_, err := r.Dial(context.Background(), "mac-a")
	var refused *RefusedError
	if !errors.As(err, &refused) || !strings.Contains(refused.Reason, "only the manager and the gateway replicas") {
		t.Errorf("mac-b asking for mac-a's tunnel: %v; want the gateway's refusal", err)
	}
	if _, err := get(t.Context(), managerClient(r), "mac-a", "/api/status"); err == nil {
		t.Error("mac-b reached mac-a's agent through the gateway")
	}
	if n := served.Load(); n != 0 {
		t.Fatalf("mac-a's agent served %d requests relayed for a Mac", n)
	}
}

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
		{name: "a Mac", id: pki.Node("mac-b"), hasCert: true, node: "mac-a", err: "only the manager"},
		{name: "a gateway", id: pki.Gateway("gw"), hasCert: true, node: "mac-a", err: "only the manager"},
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

// TestAttackTunnelRelayAsAMac: a Mac's certificate (and a gateway's) asks the
// gateway's tunnel listener for the manager's relay to another Mac, to reach that
// Mac's agent from the outside: refused, and the Mac's agent serves nothing.
func TestAttackTunnelRelayAsAMac(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	var served atomic.Int32
	startAgent(t, addr, "mac-a", source(t, fc.ca, pki.Node("mac-a")), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		served.Add(1)
	}))
	waitNodes(t, s, "mac-a")
	for _, id := range []pki.Identity{pki.Node("mac-b"), pki.Gateway("gw-2")} {
		r := &Relay{Gateway: addr, Certificates: source(t, fc.ca, id)}
		_, err := r.Dial(context.Background(), "mac-a")
		var refused *RefusedError
		if !errors.As(err, &refused) || !strings.Contains(refused.Reason, "only the manager") {
			t.Errorf("%s asking for mac-a's tunnel: %v; want the gateway's refusal", id, err)
		}
		if _, err := get(t.Context(), managerClient(r), "mac-a", "/api/status"); err == nil {
			t.Errorf("%s reached mac-a's agent through the gateway", id)
		}
	}
	if n := served.Load(); n != 0 {
		t.Fatalf("mac-a's agent served %d requests relayed for callers that are not the manager", n)
	}
}

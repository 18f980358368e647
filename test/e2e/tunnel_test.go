package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/tunnel"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// outboundLabel pins the tunnel test's deployment to its Mac.
const outboundLabel = "e2e.macfleet.dev/outbound"

// TestAgentThatDialsOut: a Mac whose advertised address nothing answers at (a Mac
// behind an office NAT) runs its agent with --connect outbound: it dials a gateway's
// --tunnel-listen, and that gateway serves the Mac's replica through the connection (a
// streamed and a whole chat). A gateway without the tunnel cannot reach the replica at
// all, and another Mac's certificate claiming this Mac is refused a tunnel. (A stream cancelled by its client through the tunnel: internal/tunnel's
// TestTunnelStreamsAndCancels.)
func TestAgentThatDialsOut(t *testing.T) {
	const mac = "mac-outbound"
	gw, tunnelAddr := tunnelGateway(t, mac)

	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "outbound", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.NodeSelector = map[string]string{outboundLabel: "true"}
	}))
	t.Cleanup(func() { removeDeployment(t, ns, "outbound") })
	r := waitReady(t, ns, "outbound", 1, 3*time.Minute)[0]
	if r.Spec.NodeName != mac {
		t.Fatalf("replica on %s, want %s", r.Spec.NodeName, mac)
	}
	model := ns + "/outbound"

	// Through the tunnel gateway: a streamed chat (the agent may still be dialing
	// when its replica turns Ready, so the first answer is waited for).
	c := openai.NewClient(option.WithBaseURL(gw+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	firstStreamedChat(t, c, model, "the tunnel gateway")
	if log := fleet.AgentLog(mac); !strings.Contains(log, "Connected to the gateway by tunnel") {
		t.Fatalf("the agent's log does not say it connected by tunnel")
	}

	// A gateway without the tunnel dials the advertised address, where nothing answers.
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	_, direct := chat(ctx, gatewayClient(), model, false)
	cancel()
	if direct == nil {
		t.Fatal("a gateway without the tunnel reached the Mac: its advertised address answers, the test proves nothing")
	}

	// Another Mac's certificate claiming this Mac is refused, and this Mac's
	// requests still reach it alone.
	impostor := &tunnel.Agent{Gateway: tunnelAddr, Node: mac, Certificates: nodeSource(t, "mac-mini-1")}
	var refused *tunnel.RefusedError
	if _, err := impostor.Connect(t.Context()); !errors.As(err, &refused) {
		t.Fatalf("mac-mini-1's certificate claiming %s: %v, want the gateway's refusal", mac, err)
	}
	t.Logf("The gateway refused the impostor: %s", refused.Reason)

	// A non-streamed chat through the tunnel too.
	if text, err := chat(t.Context(), c, model, false); err != nil || text == "" {
		t.Fatalf("chat through the tunnel: %q, %v", text, err)
	}
}

// firstStreamedChat asks model for a streamed chat through c (the gateway named
// through) until one is answered, for a minute: a tunnel may still be coming up when
// the replica turns Ready.
func firstStreamedChat(t *testing.T, c openai.Client, model, through string) {
	t.Helper()
	var text string
	var err error
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		text, err = chat(ctx, c, model, true)
		cancel()
		if err == nil || time.Now().After(deadline) {
			break
		}
		t.Logf("Chat through %s: %v; retrying", through, err)
		time.Sleep(time.Second)
	}
	if err != nil || text == "" {
		t.Fatalf("streamed chat through %s: %q, %v", through, text, err)
	}
}

// tunnelGateway starts a gateway with --tunnel-listen and Mac mac, whose agent dials
// out to it and advertises an address nothing listens on: the gateway's URL and
// tunnel address.
func tunnelGateway(t *testing.T, mac string) (gw, tunnelAddr string) {
	t.Helper()
	tunnelAddr = freeLoopback(t)
	gw, err := fleet.AddGateway(t.Context(), "", "--tunnel-listen", tunnelAddr)
	if err != nil {
		t.Fatal(err)
	}
	addOutboundMac(t, mac, tunnelAddr, false)
	return gw, tunnelAddr
}

// fleetCA is the fleet CA the manager keeps (Secret macfleet-system/macfleet-ca).
func fleetCA(t *testing.T) *pki.CA {
	t.Helper()
	var sec corev1.Secret
	if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.SystemNamespace, Name: v1alpha1.CASecret}, &sec); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(sec.Data["ca.crt"], sec.Data["ca.key"])
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// nodeSource is a certificate of the fleet CA for Mac name, as an attacker who took
// that Mac holds.
func nodeSource(t *testing.T, name string) *pki.Source {
	t.Helper()
	id := pki.Node(name)
	src, err := fleetCA(t).NewSource(&id, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// addOutboundMac adds a Mac whose agent dials out to tunnelAddr (--connect outbound,
// or with auto --gateway-tunnel alone: the agent dials out because the gateway's
// probe fails) and advertises an address nothing listens on; it is removed when the
// test ends.
func addOutboundMac(t *testing.T, name, tunnelAddr string, auto bool) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := fleet.RemoveAgent(ctx, name); err != nil {
			t.Errorf("removing Mac %s: %v", name, err)
		}
	})
	if err := fleet.AddAgent(t.Context(), localfleet.Node{Name: name, MemoryCeiling: "1536Mi",
		Chip: "Apple M4 (simulated)", UnifiedMemory: "16Gi"}); err != nil {
		t.Fatal(err)
	}
	restartAgentWith(t, name, outboundArgs(t, tunnelAddr, auto))
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"true"}}}`, outboundLabel)
	mn := &v1alpha1.MacNode{}
	mn.Name = name
	if err := fleet.Client.Patch(t.Context(), mn, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	if err := fleet.WaitNodeReady(t.Context(), name); err != nil {
		t.Fatal(err)
	}
}

// outboundArgs are the arguments of an agent whose Mac dials the gateway's tunnel at
// tunnelAddr: its advertised address answers nothing; --connect outbound, or auto
// (--gateway-tunnel alone).
func outboundArgs(t *testing.T, tunnelAddr string, auto bool) []string {
	args := []string{"--gateway-tunnel", tunnelAddr, "--advertise-address", freeLoopback(t)}
	if !auto {
		args = append(args, "--connect", "outbound")
	}
	return args
}

// restartAgentWith stops Mac name's agent and starts it again with args added.
func restartAgentWith(t *testing.T, name string, args []string) {
	t.Helper()
	if err := fleet.StopAgent(name, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := fleet.StartAgentWith(name, nil, args); err != nil {
		t.Fatal(err)
	}
}

// freeLoopback is a loopback address nothing listens on (one that just did).
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

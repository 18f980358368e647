package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestOutboundMacThroughAnotherGatewayReplica: two gateway replicas take tunnels
// (--tunnel-listen) and name each other's listeners (--tunnel-replicas); a Mac that
// dials out holds its tunnel to the first only, as an agent behind a load balancer
// reaches one replica. The second replica serves the Mac's replica too, a streamed and
// a whole chat, through the first one's tunnel.
func TestOutboundMacThroughAnotherGatewayReplica(t *testing.T) {
	const mac = "mac-outbound-replicas"
	first, second := freeLoopback(t), freeLoopback(t)
	replicas := first + "," + second
	if _, err := fleet.AddGateway(t.Context(), "", "--tunnel-listen", first, "--tunnel-replicas", replicas); err != nil {
		t.Fatal(err)
	}
	gw2, err := fleet.AddGateway(t.Context(), "", "--tunnel-listen", second, "--tunnel-replicas", replicas)
	if err != nil {
		t.Fatal(err)
	}
	addOutboundMac(t, mac, first, false)

	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "outbound", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.NodeSelector = map[string]string{outboundLabel: "true"}
	}))
	t.Cleanup(func() { removeDeployment(t, ns, "outbound") })
	if r := waitReady(t, ns, "outbound", 1, 3*time.Minute)[0]; r.Spec.NodeName != mac {
		t.Fatalf("replica on %s, want %s", r.Spec.NodeName, mac)
	}
	model := ns + "/outbound"

	// The second replica learns within a few of its list reads that the first holds
	// the Mac's tunnel: the first answer is waited for.
	c := openai.NewClient(option.WithBaseURL(gw2+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	firstStreamedChat(t, c, model, "the replica that holds no tunnel of the Mac")
	if text, err := chat(t.Context(), c, model, false); err != nil || text == "" {
		t.Fatalf("chat through the replica that holds no tunnel of the Mac: %q, %v", text, err)
	}
	log := fleet.AgentLog(mac)
	if !strings.Contains(log, "Connected to the gateway by tunnel") || !strings.Contains(log, first) || strings.Contains(log, second) {
		t.Fatalf("the agent's log does not show one tunnel, to the first replica only:\n%s", log)
	}
}

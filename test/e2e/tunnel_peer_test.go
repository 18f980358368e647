package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestOutboundMacPeerFetch: a deployment of two replicas on two Macs that dial out
// (their advertised addresses answer nothing; one with --connect outbound, one with
// --connect auto), behind an in-process gateway with
// --routing=prefix-cache, peer fetch and --tunnel-listen. A conversation's first
// turn leaves its prefix on the replica that answered, P; P is kept busy with two
// long answers to the same system prompt, so the conversation's next request goes to
// the other replica, R, which holds nothing: the gateway asks R's agent to fetch the
// prefix from P, R's agent dials P through its own tunnel (the gateway joins that
// stream to a stream of P's tunnel; the TLS is the two Macs'), R restores it, and its
// greedy answer is the first turn's. As TestPeerFetchRestoresAPrefix, the margin lets
// any fetch through.
func TestOutboundMacPeerFetch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log, relayed := countingLog(t, "Relaying a peer fetch")
	url, reg := inProcessGateway(t, gateway.Config{Routing: gateway.RoutingPrefixCache, PeerFetchMargin: 1e-9, TunnelListener: ln}, log)
	// The second Mac runs with --gateway-tunnel alone (--connect auto): it dials out
	// because the gateway's probe of its address fails.
	macs := []string{"mac-outbound", "mac-outbound-2"}
	for i, mac := range macs {
		addOutboundMac(t, mac, ln.Addr().String(), i == 1)
	}
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		return strings.Contains(fleet.AgentLog(macs[1]), "The gateway does not reach this Mac at its address"),
			"the agent of " + macs[1] + " (--connect auto) does not say the gateway's probe failed"
	})

	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "peer", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Engine.ContextLength = 16384
		md.Spec.Placement.NodeSelector = map[string]string{outboundLabel: "true"}
		md.Spec.Placement.Strategy = v1alpha1.Spread
	}))
	model := ns + "/peer"
	replicas := waitReady(t, ns, "peer", 2, 3*time.Minute)
	if replicas[0].Spec.NodeName == replicas[1].Spec.NodeName {
		t.Fatalf("both replicas are on %s; the test needs one per Mac", replicas[0].Spec.NodeName)
	}
	gw := func(metric string, labels map[string]string) float64 {
		labels["model"] = model
		return metricValue(t, reg, metric, labels)
	}
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, text, err := postChat(t.Context(), url, fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, model))
		return err == nil && code == http.StatusOK, fmt.Sprintf("the gateway does not serve %s yet: %d %s %v", model, code, text, err)
	})

	turn := prefixChat(model, 16, "Review this: func f() { go g() }")
	want, u1 := streamChat(t.Context(), t, url, "", turn)
	t.Logf("turn 1: %d prompt tokens: %q", u1.Input, want)
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		n := metricValue(t, reg, "macfleet_gateway_prefix_index_entries", nil)
		return n > 0, "the gateway's prefix index holds nothing after the first turn"
	})

	// Keep P busy with two long answers to the same system prompt.
	stop := busyHolder(t, model, func(ctx context.Context, body string) { _, _, _ = postChat(ctx, url, body) }, gw)
	defer stop()

	code, text, err := postChat(t.Context(), url, turn)
	if err != nil || code != http.StatusOK {
		t.Fatalf("the request for R: %d %s (%v)", code, text, err)
	}
	got := answerContent(t, text)
	var imported float64
	for _, mac := range macs {
		imported += agentCounter(t, localfleet.AgentURL(fleet.Agent(mac).Addr), "macfleet_agent_peer_fetches_total", map[string]string{"result": "imported"})
	}
	t.Logf("on R: %q; the agents imported %v states, the gateway relayed %d fetches", got, imported, relayed.Load())
	if n := gw("macfleet_gateway_peer_fetches_total", map[string]string{"result": "imported"}); n != 1 {
		t.Errorf("the gateway counted %v imported peer fetches, want 1 (by result: %v)", n, gw("macfleet_gateway_peer_fetches_total", map[string]string{}))
	}
	if imported != 1 {
		t.Errorf("the agents counted %v imported peer fetches, want 1", imported)
	}
	if relayed.Load() != 1 {
		t.Errorf("the gateway relayed %d peer fetches, want R's one", relayed.Load())
	}
	if got != want {
		t.Errorf("R's greedy answer after the peer's state %q differs from the full prefill's %q", got, want)
	}
}

// countingLog is a logger into the test's log, at verbosity 2, that counts the
// entries with the message msg.
func countingLog(t *testing.T, msg string) (logr.Logger, *atomic.Int32) {
	var n atomic.Int32
	return funcr.New(func(prefix, args string) {
		if strings.Contains(args, `"msg"="`+msg+`"`) {
			n.Add(1)
		}
		t.Log(prefix, args)
	}, funcr.Options{Verbosity: 2}), &n
}

// busyHolder keeps the replica that holds a conversation's prefix busy with two long
// answers to the same system prompt, each sent with post and waited for in flight
// there (gw reads the gateway's metrics of the deployment); stop (once or more) ends them
// and waits.
func busyHolder(t *testing.T, model string, post func(ctx context.Context, body string), gw func(string, map[string]string) float64) (stop func()) {
	t.Helper()
	busy, cancel := context.WithCancel(t.Context())
	done := make(chan struct{}, 2)
	stop = sync.OnceFunc(func() {
		cancel()
		<-done
		<-done
	})
	hits := gw("macfleet_gateway_routing_decisions_total", map[string]string{"routing": "prefix_hit"})
	for i := range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			post(busy, prefixChat(model, 6000, fmt.Sprintf("Tell a very long story about goroutine %d.", i)))
		}()
		testenv.Eventually(t, 30*time.Second, 10*time.Millisecond, func() (bool, string) {
			h := gw("macfleet_gateway_routing_decisions_total", map[string]string{"routing": "prefix_hit"}) - hits
			in := gw("macfleet_gateway_inflight", map[string]string{})
			return h == float64(i+1) && in == float64(i+1), fmt.Sprintf("long answer %d is not in flight on the holder (%v prefix hits, %v in flight)", i+1, h, in)
		})
	}
	return stop
}

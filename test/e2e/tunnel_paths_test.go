package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/autoscaler"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/tunnel"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// reachableMac is the Mac that serves beside the outbound one in the tunnel paths
// test: reached at its address, as before.
const reachableMac = "mac-studio-1"

// TestOutboundMacPaths: a Mac whose advertised address nothing answers at dials a
// gateway's --tunnel-listen, and a deployment of two replicas runs on it and on a Mac
// the gateway reaches directly. Through that gateway only:
//
//   - cancel: streams cut by their clients while the outbound Mac's replica writes
//     some of them end there too (its agent's lease on the runner is released, so the
//     slot is free), and the replica answers the next request;
//   - the manager's reads: the autoscaler's load source, with the manager's
//     certificate, reads the outbound Mac's agent through the gateway's tunnel
//     listener (manager --gateway-tunnel), where at the advertised address it fails;
//   - continuation: the outbound Mac's runner is killed with SIGKILL while it writes
//     streams, and every stream completes as an uninterrupted one does, those it
//     was writing continued on the other Mac's replica.
func TestOutboundMacPaths(t *testing.T) {
	const mac = "mac-outbound"
	gw, tunnelAddr := tunnelGateway(t, mac)
	labelMac(t, reachableMac)
	// The streams of this test go to the tunnel gateway (postStream sends to
	// fleet.GatewayURL; the tests run one after another).
	saved := fleet.GatewayURL
	fleet.GatewayURL = gw
	t.Cleanup(func() { fleet.GatewayURL = saved })

	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "paths", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.NodeSelector = map[string]string{outboundLabel: "true"}
		md.Spec.Placement.Strategy = v1alpha1.Spread
		// Room for a continuation's prompt (TestStreamsSurviveARunnerKill says why).
		md.Spec.Engine.Settings = engine.Settings{ContextLength: 2048, Parallel: 2}
	}))
	key := outboundReplica(t, ns, "paths", mac)
	model := ns + "/paths"
	addr := fleet.Agent(mac).Addr
	waitTunnelServes(t, model)

	t.Run("manager reads", func(t *testing.T) { managerReadsThroughTunnel(t, ns, "paths", mac, tunnelAddr) })
	t.Run("cancel", func(t *testing.T) { cancelThroughTunnel(t, model, addr, key) })
	t.Run("continuation", func(t *testing.T) { continueThroughTunnel(t, model, addr, key) })
}

// continueThroughTunnel kills the runner of the outbound Mac's replica (key, its agent
// at addr) with SIGKILL while it writes streams: every stream completes, and some
// are continued on the other Mac's replica. A kill that broke no stream (all its
// requests before their first byte) is tried again, up to 5 rounds.
func continueThroughTunnel(t *testing.T, model, addr, key string) {
	killed := 0
	for round := 1; ; round++ {
		if round > 1 {
			waitTunnelServes(t, model)
		}
		var pid int
		testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
			pid = int(runnerPIDs(t, addr)[key])
			return pid != 0 && pid != killed, fmt.Sprintf("runner %d of %s (killed: %d)", pid, key, killed)
		})
		continued := streamsWhile(t, model, 24, func() bool { return activeRequests(t.Context(), addr, key) > 0 },
			func() { killRunner(t, "", pid) })
		killed = pid
		t.Logf("round %d: 24 streams, %d continued on %s's replica after the outbound Mac's runner was killed", round, continued, reachableMac)
		switch {
		case continued > 0 || t.Failed():
			return
		case round == 5:
			t.Error("no stream was continued in 5 rounds: the outbound Mac's replica wrote none when its runner was killed")
			return
		}
	}
}

// labelMac puts the outbound label on a Mac too, until the test ends.
func labelMac(t *testing.T, name string) {
	t.Helper()
	patchLabel := func(ctx context.Context, value string) error {
		mn := &v1alpha1.MacNode{}
		mn.Name = name
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%s}}}`, outboundLabel, value)
		return fleet.Client.Patch(ctx, mn, client.RawPatch(types.MergePatchType, patch))
	}
	if err := patchLabel(t.Context(), `"true"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := patchLabel(ctx, "null"); err != nil {
			t.Errorf("removing the label of %s: %v", name, err)
		}
	})
}

// outboundReplica waits for the deployment's two replicas, one on mac, and returns
// the key (namespace/name) of mac's.
func outboundReplica(t *testing.T, ns, name, mac string) string {
	t.Helper()
	for _, r := range waitReady(t, ns, name, 2, 3*time.Minute) {
		if r.Spec.NodeName == mac {
			return r.Namespace + "/" + r.Name
		}
	}
	t.Fatalf("no replica of %s/%s on %s", ns, name, mac)
	return ""
}

// waitTunnelServes waits until the tunnel gateway answers model (the agent may still
// be dialing when its replica turns Ready).
func waitTunnelServes(t *testing.T, model string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		var streaming atomic.Int32
		r := survivorStream(ctx, model, 0, &streaming)
		return r.err == "", "a stream through the tunnel gateway: " + r.err
	})
}

// cancelThroughTunnel sends long streams until the outbound Mac's replica (key, its
// agent at addr) writes some, cuts them all, and checks that its agent's count of
// active requests falls to zero long before the answers asked would have ended, and
// that every slot then serves again. A round whose answers on the outbound replica
// ran to their end before the cut (the random-weight model writes 1800 tokens in
// about a second on a loaded machine, and a poll of the agent may come too late)
// shows nothing about the cancel and is tried again, up to cancelRounds.
func cancelThroughTunnel(t *testing.T, model, addr, key string) {
	tokens := func() float64 {
		return agentCounter(t, localfleet.AgentURL(addr), "macfleet_agent_generated_tokens_total", map[string]string{"model": key})
	}
	for round := 1; ; round++ {
		active, generated, ended, ok := cutStreams(t, model, addr, key, tokens)
		if ok && generated < float64(active*longTokens) {
			t.Logf("round %d: the outbound replica's %d streams ended %v after their clients left, %v tokens generated of %d asked",
				round, active, ended.Round(time.Millisecond), generated, active*longTokens)
			break
		}
		if round == cancelRounds {
			t.Fatalf("in %d rounds the outbound replica's answers always ran to their end (last: %d streams seen, %v tokens generated of %d asked): the cancel did not reach it, or it never wrote a stream that was still running when cut",
				round, active, generated, active*longTokens)
		}
		t.Logf("round %d: the outbound replica's answers were not cut while running (%d streams seen, %v tokens of %d); again",
			round, active, generated, active*longTokens)
	}
	// Both slots of each replica are free: four streams at once all complete.
	n := streamsWhile(t, model, 4, func() bool { return true }, func() {})
	t.Logf("after the cancel, 4 streams completed (%d continued)", n)
}

// cancelRounds is how many rounds cancelThroughTunnel tries.
const cancelRounds = 5

// cutStreams is one round of cancelThroughTunnel: four long streams, cut once two
// have content and the outbound replica counts requests. It returns the requests the
// replica counted then, the tokens it generated in the round, how long after the cut
// its count fell to zero, and whether the replica was seen with requests before the
// streams ended by themselves.
func cutStreams(t *testing.T, model, addr, key string, tokens func() float64) (active int, generated float64, ended time.Duration, ok bool) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	var streaming atomic.Int32
	before := tokens()
	for i := range 4 {
		wg.Go(func() { longStream(ctx, model, i, &streaming) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	testenv.Eventually(t, time.Minute, 5*time.Millisecond, func() (bool, string) {
		select {
		case <-done:
			return true, ""
		default:
		}
		var s int32
		s, active = streaming.Load(), activeRequests(t.Context(), addr, key)
		ok = s >= 2 && active > 0
		return ok, fmt.Sprintf("%d streams have content, the outbound replica has %d requests", s, active)
	})
	cancel()
	cut := time.Now()
	<-done
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		n := activeRequests(t.Context(), addr, key)
		return n == 0, fmt.Sprintf("the outbound replica still has %d requests after its clients left", n)
	})
	return active, tokens() - before, time.Since(cut), ok
}

// longTokens is a long stream's max_tokens: most of the context.
const longTokens = 1800

// longStream streams a long answer to model until ctx ends, adding 1 to streaming
// once it has content.
func longStream(ctx context.Context, model string, i int, streaming *atomic.Int32) {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"temperature":0,
		"messages":[{"role":"user","content":"Story %d: tell me a very long story."}]}`, model, longTokens, i)
	// Speculation off: the random-weight model's greedy answer loops, and prompt
	// lookup drafts a loop eight tokens a step, so that the answers end before the
	// cut they are for.
	resp, problem := postStream(ctx, "/v1/chat/completions", body, runnerapi.HeaderSpeculation, runnerapi.SpeculationOff)
	if problem != "" {
		return
	}
	defer resp.Body.Close()
	counted := false
	_, _ = readChunks(resp.Body, func(c runnerapi.ChatCompletionChunk) {
		if !counted && len(c.Choices) > 0 && c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
			counted = true
			streaming.Add(1)
		}
	})
}

// streamsWhile runs n streams to model through the tunnel gateway, calls act once
// ready says so (polled while they stream), checks every stream as
// TestStreamsSurviveARunnerKill does, and returns how many were continued.
func streamsWhile(t *testing.T, model string, n int, ready func() bool, act func()) int {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var streaming atomic.Int32
	results := make([]streamResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i] = survivorStream(ctx, model, i, &streaming) })
	}
	testenv.Eventually(t, time.Minute, 5*time.Millisecond, func() (bool, string) {
		return streaming.Load() >= 4 && ready(), fmt.Sprintf("%d streams have content", streaming.Load())
	})
	act()
	wg.Wait()
	return countContinued(t, results)
}

// countContinued reports every stream's error and counts those continued.
func countContinued(t *testing.T, results []streamResult) int {
	t.Helper()
	continued := 0
	for i, r := range results {
		if r.err != "" {
			t.Errorf("stream %d: %s", i, r.err)
		}
		if r.continued != "" {
			continued++
		}
	}
	return continued
}

// managerReadsThroughTunnel measures deployment name's load as the manager does
// (autoscaler.AgentSource, the manager's certificate): at the replicas' addresses it
// fails on the outbound Mac's; through the gateway's tunnel listener, once Mac mac
// holds its tunnel there, it reads both.
func managerReadsThroughTunnel(t *testing.T, ns, name, mac, tunnelAddr string) {
	id := pki.Manager("macfleet-manager")
	certs, err := fleetCA(t).NewSource(&id, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var md v1alpha1.ModelDeployment
	if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &md); err != nil {
		t.Fatal(err)
	}
	direct := &autoscaler.AgentSource{Client: fleet.Client, Certificates: certs}
	if _, err := direct.Measure(t.Context(), &md); err == nil {
		t.Fatal("the manager read every replica's agent at its address: the outbound Mac's answers there, the test proves nothing")
	} else {
		t.Logf("At the addresses: %v", err)
	}
	relay := &tunnel.Relay{Gateway: tunnelAddr, Certificates: certs}
	// The replica turns Ready, and waitTunnelServes passes on the other Mac's
	// replica, before the outbound Mac's tunnel may be up: the gateway answers
	// "none" until then, and the manager would dial the address that fails.
	start := time.Now()
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		c, err := relay.Dial(t.Context(), mac)
		if err != nil {
			return false, fmt.Sprintf("asking the gateway's tunnel listener for %s: %v", mac, err)
		}
		c.Close()
		return true, ""
	})
	t.Logf("%s holds its tunnel at the gateway (waited %v)", mac, time.Since(start).Round(time.Millisecond))
	via := &autoscaler.AgentSource{Client: fleet.Client, Certificates: certs,
		HTTP: &http.Client{Timeout: autoscaler.DefaultAgentTimeout, Transport: relay.Transports()}}
	load, err := via.Measure(t.Context(), &md)
	if err != nil {
		t.Fatalf("the manager reading through the gateway's tunnel listener: %v", err)
	}
	t.Logf("through the tunnel listener: load %+v", load)
}

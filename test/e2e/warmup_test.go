package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestWarmUpFromPeers: team A's deployment of one replica P, opted in to peer warm-up
// (spec.engine.promptCache.peerWarmup), behind a gateway with --routing=prefix-cache
// and peer fetch, holds a long conversation of team A and one
// of team B (another namespace granted the deployment, with another system prompt),
// each in its tenant's cache partition. Scaled to two, the new replica R on the other
// Mac starts cold; its Mac served neither team's partition, so the gateway warms it
// with nothing of theirs (docs/security.md: a Mac sees the prompts of the partitions
// routed to it, never the states of another's conversations): the gateway counts the
// cold epoch as nothing_to_warm, R's agent imports nothing and R's prefix events list
// nothing, and asked directly as a gateway would, R restores neither conversation in
// either partition. (A Mac that served a partition is warmed with its states:
// TestWarmerWarmsAColdReplica, gateway.)
func TestWarmUpFromPeers(t *testing.T) {
	s := newPeerTenants(t, "warm", 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Engine.PromptCache = &v1alpha1.PromptCacheSpec{PeerWarmup: ptr.To(true)}
	})
	ns, nsB, model, tokA, tokB, url, reg, gw := s.ns, s.nsB, s.model, s.tokA, s.tokB, s.url, s.reg, s.gw
	p := waitReady(t, ns, "warm", 1, 3*time.Minute)[0]
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, text, err := postChatAs(t.Context(), url, tokA, fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, model))
		return err == nil && code == http.StatusOK, fmt.Sprintf("the gateway does not serve %s yet: %d %s %v", model, code, text, err)
	})
	turnA := func(m string) string { return prefixChat(m, 16, "Review this: func f() { go g() }") }
	turnB := func(m string) string {
		return strings.Replace(prefixChat(m, 16, "Review this: func h() { defer k() }"), `"content":"You are`, `"content":"Team B asks: you are`, 1)
	}
	_, uA := streamChat(t.Context(), t, url, tokA, turnA(model))
	_, uB := streamChat(t.Context(), t, url, tokB, turnB(model))
	t.Logf("on P: team A %d prompt tokens (%d cached); team B %d (%d cached)", uA.Input, uA.Cached, uB.Input, uB.Cached)

	scale(t, ns, "warm", 2)
	var r v1alpha1.ModelReplica
	for _, rep := range waitReady(t, ns, "warm", 2, 3*time.Minute) {
		if rep.Name != p.Name {
			r = rep
		}
	}
	if r.Spec.NodeName == p.Spec.NodeName {
		t.Fatalf("the new replica is on P's Mac %s; the test needs another", p.Spec.NodeName)
	}
	rKey := ns + "/" + r.Name
	rAgent := localfleet.AgentURL(r.Status.Endpoint)
	testenv.Eventually(t, 2*time.Minute, 100*time.Millisecond, func() (bool, string) {
		n := metricValue(t, reg, "macfleet_gateway_peer_warmups_skipped_total", map[string]string{"node": r.Spec.NodeName, "reason": "nothing_to_warm"})
		return n == 1, fmt.Sprintf("the gateway counted %v cold epochs of R's Mac with nothing to warm, want 1", n)
	})
	if n := gw("macfleet_gateway_peer_warmups_total", map[string]string{}); n != 0 {
		t.Errorf("the gateway asked %v warm-ups of R, whose Mac served neither team, want 0", n)
	}
	if n := agentCounter(t, rAgent, "macfleet_agent_peer_warmups_total", map[string]string{"model": rKey, "result": "imported"}); n != 0 {
		t.Errorf("R's agent imported %v warm-ups, want 0", n)
	}
	var ev runnerapi.PrefixEvents
	if err := agentGet(t.Context(), r.Status.Endpoint, "/api/models/"+strings.ReplaceAll(rKey, "/", "%2F")+"/prefixes", &ev); err != nil {
		t.Fatal(err)
	}
	for _, e := range ev.Events {
		if e.Tier != "" {
			t.Errorf("R holds digest %s before any request reached it", e.Digest)
		}
	}
	// R, asked directly as a gateway would (no peer hint), in each partition.
	for _, tc := range []struct{ name, body, partition string }{
		{"team A's in A's partition", turnA(rKey), ns}, {"team B's in B's partition", turnB(rKey), nsB},
	} {
		code, text := call(t, rAgent, http.MethodPost, "/v1/chat/completions", asGateway, tc.body,
			v1alpha1.HeaderReplica, rKey, runnerapi.HeaderCachePartition, tc.partition)
		if code != http.StatusOK {
			t.Fatalf("R, %s: %d %s", tc.name, code, text)
		}
		if u := answerUsage(t, text); u.Cached != 0 {
			t.Errorf("R restored %d tokens of %s conversation, want 0: it was never warmed with it", u.Cached, tc.name)
		}
	}
}

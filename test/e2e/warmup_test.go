package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestWarmUpFromPeers: team A's deployment of one replica P, behind a gateway with
// --routing=prefix-cache and peer fetch, holds a long conversation of team A and one
// of team B (another namespace granted the deployment, with another system prompt),
// each in its tenant's cache partition. Scaled to two, the new replica R on the other
// Mac starts cold; the gateway asks R's agent to warm up from P before any request
// reaches R: R's agent counts two imported warm-ups, and every digest R's prefix
// events list is one P holds. Then, asked directly as a gateway would, R restores team
// A's conversation in A's partition (cached tokens) and answers exactly as the full
// prefill did (greedy), and team B's in B's; each conversation in the other
// partition restores nothing.
func TestWarmUpFromPeers(t *testing.T) {
	s := newPeerTenants(t, "warm", 1)
	ns, nsB, model, tokA, tokB, url, reg, gw := s.ns, s.nsB, s.model, s.tokA, s.tokB, s.url, s.reg, s.gw
	p := waitReady(t, ns, "warm", 1, 3*time.Minute)[0]
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, text, err := postChatAs(t.Context(), url, tokA, fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, model))
		return err == nil && code == http.StatusOK, fmt.Sprintf("the gateway does not serve %s yet: %d %s %v", model, code, text, err)
	})
	// Team A's conversation, streamed (the gateway measures the prefill rate from it),
	// and team B's, whose system prompt differs from its first words.
	turnA := func(m string) string { return prefixChat(m, 16, "Review this: func f() { go g() }") }
	turnB := func(m string) string {
		return strings.Replace(prefixChat(m, 16, "Review this: func h() { defer k() }"), `"content":"You are`, `"content":"Team B asks: you are`, 1)
	}
	wantA, uA := streamChat(t.Context(), t, url, tokA, turnA(model))
	wantB, uB := streamChat(t.Context(), t, url, tokB, turnB(model))
	t.Logf("on P: team A %d prompt tokens (%d cached) %q; team B %d (%d cached) %q", uA.Input, uA.Cached, wantA, uB.Input, uB.Cached, wantB)
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		n := metricValue(t, reg, "macfleet_gateway_prefix_index_entries", nil)
		return n >= 2, fmt.Sprintf("the gateway's prefix index holds %v digests, want both conversations'", n)
	})

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
	rKey, pKey := ns+"/"+r.Name, ns+"/"+p.Name
	rAgent := localfleet.AgentURL(r.Status.Endpoint)
	testenv.Eventually(t, 2*time.Minute, 100*time.Millisecond, func() (bool, string) {
		n := agentCounter(t, rAgent, "macfleet_agent_peer_warmups_total", map[string]string{"model": rKey, "result": "imported"})
		return n == 2, fmt.Sprintf("R's agent counted %v imported warm-ups, want 2 (gateway: %v by result)", n,
			gw("macfleet_gateway_peer_warmups_total", map[string]string{}))
	})
	if n := gw("macfleet_gateway_peer_warmups_total", map[string]string{"result": "imported"}); n != 2 {
		t.Errorf("the gateway counted %v imported warm-ups, want 2", n)
	}
	if n := gw("macfleet_gateway_peer_fetches_total", map[string]string{"result": "imported"}); n != 2 {
		t.Errorf("the gateway counted %v imported peer fetches, want the 2 warm-ups", n)
	}
	var st struct {
		PeerFetches map[string]struct {
			Results map[string]int64 `json:"results"`
			Warmups map[string]int64 `json:"warmups"`
		} `json:"peerFetches"`
	}
	if err := agentGet(t.Context(), r.Status.Endpoint, "/api/status", &st); err != nil {
		t.Fatal(err)
	}
	if got := st.PeerFetches[rKey]; got.Warmups["imported"] != 2 || got.Results["imported"] != 2 {
		t.Errorf("R's /api/status peerFetches = %+v, want 2 imported warm-ups among 2 imported fetches", got)
	}
	held := func(endpoint, key string) []string {
		var ev runnerapi.PrefixEvents
		if err := agentGet(t.Context(), endpoint, "/api/models/"+strings.ReplaceAll(key, "/", "%2F")+"/prefixes", &ev); err != nil {
			t.Fatal(err)
		}
		var ds []string
		for _, e := range ev.Events {
			if e.Tier != "" {
				ds = append(ds, e.Digest)
			}
		}
		return ds
	}
	rHeld, pHeld := held(r.Status.Endpoint, rKey), held(p.Status.Endpoint, pKey)
	if len(rHeld) == 0 {
		t.Fatal("R's prefix events list no digest after the warm-up")
	}
	for _, d := range rHeld {
		if !slices.Contains(pHeld, d) {
			t.Errorf("R holds digest %s, which P does not (P: %v)", d, pHeld)
		}
	}

	// R, asked directly as a gateway would, in each partition.
	ask := func(body, partition string) (string, int64, int64) {
		t.Helper()
		code, text := call(t, rAgent, http.MethodPost, "/v1/chat/completions", asGateway, body,
			v1alpha1.HeaderReplica, rKey, runnerapi.HeaderCachePartition, partition)
		if code != http.StatusOK {
			t.Fatalf("R in partition %s: %d %s", partition, code, text)
		}
		u := answerUsage(t, text)
		return answerContent(t, text), u.Input, u.Cached
	}
	if got, in, cached := ask(turnA(rKey), ns); cached < uA.Input/2 || got != wantA {
		t.Errorf("team A's conversation on R in A's partition: %d of %d tokens restored, answer %q; want at least half restored and %q",
			cached, in, got, wantA)
	}
	if _, _, cached := ask(turnA(rKey), nsB); cached != 0 {
		t.Errorf("team A's conversation on R in B's partition restored %d tokens, want 0", cached)
	}
	if got, in, cached := ask(turnB(rKey), nsB); cached < uB.Input/2 || got != wantB {
		t.Errorf("team B's conversation on R in B's partition: %d of %d tokens restored, answer %q; want at least half restored and %q",
			cached, in, got, wantB)
	}
	if _, _, cached := ask(turnB(rKey), ns); cached != 0 {
		t.Errorf("team B's conversation on R in A's partition restored %d tokens, want 0", cached)
	}
}

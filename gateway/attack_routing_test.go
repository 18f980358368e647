package gateway

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/prefixdigest"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAttackClaimedPrefixDrawsConversations: a compromised Mac (replica a/r0) claims in
// its prefix events, which the gateway's real poller reads from its agent over HTTP,
// to hold the prompts of four conversations (four agents' prompts) it was never sent.
// Unkeyed, their digests were computable by anyone who could guess the prompt (a
// public coding agent's system prompt, the deployment's name and the partition), and
// every one of them was routed to it as a prefix hit. Now the gateways key the digests
// with the secret they share: the claims match nothing, the four are routed by the
// fallback and spread over both replicas. What a replica was really sent still goes
// back to it by its prefix, from this gateway and from a second one that shares the
// key and learns the index from the agents alone (a restarted gateway).
func TestAttackClaimedPrefixDrawsConversations(t *testing.T) {
	evil, honest := newCacheAgent(t, "a/r0"), newCacheAgent(t, "a/r1")
	key := bytes.Repeat([]byte{7}, 32)
	keyed := Options{Routing: RoutingPrefixCache, PrefixDigestKey: func() ([]byte, bool) { return key, true }}
	g := newTestGateway(t, keyed)
	t.Cleanup(g.Close)
	g.serveReplicas(evil.host(), honest.host())

	// Four agents' prompts (four teams, four tools): conversations that share nothing.
	victims := make([]string, 4)
	var claims []runnerapi.PrefixEvent
	for i := range victims {
		system := fmt.Sprintf(`{"role":"system","content":"You are coding agent %d. %s"}`, i, strings.Repeat("Use the tools. ", 40))
		victims[i] = fmt.Sprintf(`{"model":"m","messages":[%s,{"role":"user","content":"Fix the bug in the repository"}]}`, system)
		for j, d := range prefixdigest.Of("", "a/m", []byte(victims[i])) {
			claims = append(claims, runnerapi.PrefixEvent{Digest: d, Tier: runnerapi.TierHot, Tokens: 5000 * (j + 1)})
		}
	}
	evil.events.Publish(claims...)
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return g.bal.Index().Len("a/r0") >= len(victims), "the index learns the compromised Mac's claims"
	})

	hits := func(g *testGateway) float64 {
		return testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routing.RoutedPrefixHit))
	}
	drawn, home := 0, ""
	for i, v := range victims {
		_, got := post(t, g.url, v)
		if got == `{"replica":"a/r0"}` {
			drawn++
		}
		if i == 0 {
			home = got
		}
	}
	if n := hits(g); n != 0 {
		t.Errorf("%v of the %d conversations the compromised Mac claimed were routed to it as prefix hits, want none", n, len(victims))
	}
	if drawn == len(victims) {
		t.Errorf("every one of the %d claimed conversations went to the compromised Mac", len(victims))
	}

	// What the gateway did send a replica is routed back to it by its prefix, by this
	// gateway and by a second one with the same key and an index of its own.
	homeKey := map[string]string{`{"replica":"a/r0"}`: "a/r0", `{"replica":"a/r1"}`: "a/r1"}[home]
	c, _ := prefixdigest.Parse([]byte(victims[0]))
	digests := c.KeyedDigests(key, "", "a/m")
	next := strings.TrimSuffix(victims[0], "]}") + `,{"role":"assistant","content":"Done."},{"role":"user","content":"And the tests?"}]}`
	g2 := newTestGateway(t, keyed)
	t.Cleanup(g2.Close)
	g2.serveReplicas(evil.host(), honest.host())
	for i, gw := range []*testGateway{g, g2} {
		testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
			return gw.bal.Index().Deepest(homeKey, digests).Depth > 0, fmt.Sprintf("gateway %d learns what %s was sent", i+1, homeKey)
		})
		before := hits(gw)
		if _, got := post(t, gw.url, next); got != home {
			t.Errorf("gateway %d: the conversation's next turn went to %s, want %s, which was sent its start", i+1, got, home)
		}
		if n := hits(gw) - before; n != 1 {
			t.Errorf("gateway %d: %v requests routed by a prefix hit, want the conversation's next turn", i+1, n)
		}
	}
}

// TestPrefixDigestKeyNotLoaded: a gateway whose shared key has not loaded yet sends no
// digests (an unkeyed one would let the Mac learn digests it could replay) and routes
// by the fallback.
func TestPrefixDigestKeyNotLoaded(t *testing.T) {
	a := newCacheAgent(t, "a/r0")
	g := newTestGateway(t, Options{Routing: RoutingPrefixCache, PrefixDigestKey: func() ([]byte, bool) { return nil, false }})
	t.Cleanup(g.Close)
	g.serveReplicas(a.host())
	body := `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`
	if _, got := post(t, g.url, body); got != `{"replica":"a/r0"}` {
		t.Fatalf("answer %s, want the replica's", got)
	}
	if d := a.lastDigests(); d != "" {
		t.Errorf("the agent was sent digests %q before the key loaded, want none", d)
	}
	if n := testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routing.RoutedFallback)); n != 1 {
		t.Errorf("%v requests routed by the fallback, want 1", n)
	}
}

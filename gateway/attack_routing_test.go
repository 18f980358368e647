package gateway

import (
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
// to hold the prompts of four conversations (four agents' prompts) it was never sent: their digests are
// computable by anyone who can guess the prompt (a public coding agent's system
// prompt, the deployment's name and the partition). On main every one of them was
// routed to it as a prefix hit, and the Mac read them all. Now a replica's claim counts
// only as deep as the gateway sent it of the conversation: the four are routed by the
// fallback as if nobody held them, and spread over both replicas; the conversation
// the Mac was really sent still goes back to it by its prefix.
func TestAttackClaimedPrefixDrawsConversations(t *testing.T) {
	evil, honest := newCacheAgent(t, "a/r0"), newCacheAgent(t, "a/r1")
	g := newTestGateway(t, Options{Routing: RoutingPrefixCache})
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

	hits := func() float64 { return testutil.ToFloat64(g.metrics.routing.WithLabelValues("a/m", routing.RoutedPrefixHit)) }
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
	if n := hits(); n != 0 {
		t.Errorf("%v of the %d conversations the compromised Mac claimed were routed to it as prefix hits, want none", n, len(victims))
	}
	if drawn == len(victims) {
		t.Errorf("every one of the %d claimed conversations went to the compromised Mac", len(victims))
	}

	// What the gateway did send a replica is routed back to it by its prefix.
	homeKey := map[string]string{`{"replica":"a/r0"}`: "a/r0", `{"replica":"a/r1"}`: "a/r1"}[home]
	digests := prefixdigest.Of("", "a/m", []byte(victims[0]))
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return g.bal.Index().Deepest(homeKey, digests).Depth > 0, "the index learns what " + homeKey + " was sent"
	})
	next := strings.TrimSuffix(victims[0], "]}") + `,{"role":"assistant","content":"Done."},{"role":"user","content":"And the tests?"}]}`
	if _, got := post(t, g.url, next); got != home {
		t.Errorf("the conversation's next turn went to %s, want %s, which was sent its start", got, home)
	}
	if n := hits(); n < 1 {
		t.Errorf("%v requests routed by a prefix hit, want the conversation's next turn", n)
	}
}

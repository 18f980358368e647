package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAttackForgedStateOfAPrefixNeverSent: a compromised Mac (mac-evil, a replica of
// team-a's deployment that was sent one conversation of team-a) claims in its prefix
// events, which the gateway's real poller reads from its agent over HTTP on loopback,
// to hold team-b's system prompt (its digests are computable from a guessed prompt and
// the partition's name) and a deeper turn of team-a's conversation than it was sent,
// each with many tokens: the gateway would then have honest Macs fetch those states
// from it, and it would serve forged KV that passes every check of the importing
// runner (the key is what the tokens give; the CRCs are its own). On main the gateway
// hinted the honest replica to fetch team-b's prefix from mac-evil. Now a state is
// fetched from a replica only for a prefix the gateway sent it: the team-b request
// and the deeper team-a turn carry no hint (the honest replica prefills), while the
// prefix mac-evil was sent is still fetched from it.
func TestAttackForgedStateOfAPrefixNeverSent(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p, index, _, _ := newTestPeerFetcher(t, t0)
	const model = "team-a/chat"
	p.observePrefill(model, &metering.Usage{Input: 2100, Cached: 100}, 20*time.Second)
	teamA := []string{"00000000000000a1", "00000000000000a2", "00000000000000a3"}
	teamB := []string{"00000000000000b1", "00000000000000b2"}

	var polled atomic.Int32
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/prefixes") {
			http.NotFound(w, r)
			return
		}
		polled.Add(1)
		var ev []runnerapi.PrefixEvent
		for i, d := range append(append([]string{}, teamA...), teamB...) {
			ev = append(ev, runnerapi.PrefixEvent{Digest: d, Tier: runnerapi.TierHot, Tokens: 3000 + 1000*i})
		}
		if r.URL.Query().Get("epoch") == "forged" {
			_ = json.NewEncoder(w).Encode(runnerapi.PrefixEvents{Epoch: "forged", Seq: 1})
			return
		}
		_ = json.NewEncoder(w).Encode(runnerapi.PrefixEvents{Epoch: "forged", Seq: 1, Reset: true, Events: ev})
	}))
	t.Cleanup(evil.Close)
	bad := Backend{Key: "team-a/chat-0", Endpoint: strings.TrimPrefix(evil.URL, "http://"), Node: "mac-evil", Slots: 2}
	honest := Backend{Key: "team-a/chat-1", Endpoint: "10.0.0.2:8443", Node: "mac-2", Slots: 2}
	rt := &Route{Namespace: "team-a", Deployment: "chat", Backends: []Backend{bad, honest}}
	pollAgent(t, index, bad, nil)
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		n := index.Deepest(bad.Key, teamB).Depth
		return n == len(teamB), fmt.Sprintf("the index holds %d of team-b's digests from mac-evil's claim (%d polls)", n, polled.Load())
	})

	// mac-evil was sent the first two turns of team-a's conversation.
	ask := func(digests []string, partition string) (string, string) {
		out, _ := http.NewRequest(http.MethodPost, "https://"+honest.Endpoint+"/v1/chat/completions", nil)
		if src := p.hint(out, rt, model, bad, prefixAsk{digests: teamA[:2], partition: "team-a"}); src != nil {
			t.Fatalf("routing to mac-evil itself hinted a fetch from %s", src.be.Key)
		}
		out, _ = http.NewRequest(http.MethodPost, "https://"+honest.Endpoint+"/v1/chat/completions", nil)
		p.hint(out, rt, model, honest, prefixAsk{digests: digests, partition: partition})
		var h runnerapi.PeerStateHint
		if v := out.Header.Get(runnerapi.HeaderPeerState); v != "" {
			if err := json.Unmarshal([]byte(v), &h); err != nil {
				t.Fatal(err)
			}
		}
		return h.Model, h.Digest
	}
	for _, tc := range []struct {
		name, partition string
		digests         []string
		wantDigest      string
	}{
		{"team-b's system prompt, never sent to mac-evil", "team-b", teamB, ""},
		{"team-a's turn deeper than mac-evil was sent: only what it was sent", "team-a", teamA, teamA[1]},
		{"team-a's digests in team-b's partition", "team-b", teamA, ""},
	} {
		model, digest := ask(tc.digests, tc.partition)
		if digest != tc.wantDigest || (digest != "" && model != bad.Key) {
			t.Errorf("%s: the honest replica is hinted to fetch %q of %q, want %q", tc.name, digest, model, tc.wantDigest)
		}
	}
}

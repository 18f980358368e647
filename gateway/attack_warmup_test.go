package gateway

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/peerfetch"
	"github.com/macfleet/macfleet/gateway/prefixindex"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// pollAgent has the gateway's real prefix poller poll be's agent over HTTP (loopback)
// into index until the test ends, calling onCold (nil: nothing) for a cold replica.
func pollAgent(t *testing.T, index *prefixindex.Index, be Backend, onCold func(prefixindex.Target, string)) *prefixindex.Poller {
	t.Helper()
	poller := &prefixindex.Poller{Index: index, Log: logr.Discard(), MinBackoff: time.Millisecond, Wait: time.Second,
		Fetch: prefixindex.HTTPFetch{Transport: http.DefaultTransport, Scheme: "http://"}.Fetch, OnCold: onCold}
	poller.Sync([]prefixindex.Target{{Key: be.Key, Endpoint: be.Endpoint, Node: be.Node}})
	t.Cleanup(poller.Close)
	return poller
}

// TestAttackColdEpochsHarvestConversations: a compromised Mac (mac-evil, holding a
// replica of team-a's deployment that served team-a's requests) answers every prefix
// poll of the gateway with a fresh, empty runner epoch, to be warmed again and again
// with tickets for the prompt states of the conversations served on the other Mac —
// team-b's among them, which it never served. The gateway's real poller polls it
// over HTTP on loopback and its warmer posts the warm-ups to it. On main every epoch
// earned a warm-up with a ticket for team-b's state. Now: one warm-up, of team-a's
// state only; the later epochs are counted in
// macfleet_gateway_peer_warmups_skipped_total and earn nothing.
func TestAttackColdEpochsHarvestConversations(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p, index, reg, ca := newTestPeerFetcher(t, t0)
	const model = "team-a/chat"
	p.est.ObservePrefill(model, 1000, time.Minute)

	var mu sync.Mutex
	var polls int
	var hints []runnerapi.PeerStateHint
	var warmups int
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/prefixes"):
			polls++
			_ = json.NewEncoder(w).Encode(runnerapi.PrefixEvents{Epoch: fmt.Sprintf("fresh-%d", polls), Reset: true})
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/states/warm"):
			var req runnerapi.PeerWarmRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			warmups++
			hints = append(hints, req.Hints...)
			_ = json.NewEncoder(w).Encode(runnerapi.PeerWarmResponse{Results: make([]runnerapi.PeerStateResult, len(req.Hints))})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(evil.Close)
	evilAddr := strings.TrimPrefix(evil.URL, "http://")

	honest := Backend{Key: "team-a/chat-0", Endpoint: "10.0.0.1:8443", Node: "mac-1", Slots: 2}
	bad := Backend{Key: "team-a/chat-1", Endpoint: evilAddr, Node: "mac-evil", Slots: 2}
	table := routing.TableOf(&Route{Namespace: "team-a", Deployment: "chat", PeerWarmup: true, Backends: []Backend{honest, bad}})
	convA := []string{"000000000000000a", "000000000000000b"}
	convB := []string{"00000000000000b1", "00000000000000b2"}
	index.Apply(honest.Key, runnerapi.PrefixEvents{Epoch: "e", Seq: 1, Reset: true, Events: []runnerapi.PrefixEvent{
		{Digest: convA[1], Tier: runnerapi.TierHot, Tokens: 2000}, {Digest: convB[1], Tier: runnerapi.TierHot, Tokens: 3000}}})

	post := func(ctx context.Context, be Backend, req runnerapi.PeerWarmRequest) (runnerapi.PeerWarmResponse, error) {
		body, _ := json.Marshal(req)
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+be.Endpoint+"/api/models/"+be.Key+"/states/warm", bytes.NewReader(body))
		if err != nil {
			return runnerapi.PeerWarmResponse{}, err
		}
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			return runnerapi.PeerWarmResponse{}, err
		}
		defer resp.Body.Close()
		var out runnerapi.PeerWarmResponse
		b, _ := io.ReadAll(resp.Body)
		return out, json.Unmarshal(b, &out)
	}
	w, err := newWarmer(p, func() *Table { return table }, post, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)
	// team-a's conversation was served on both Macs, team-b's only on mac-1.
	w.record(model, convA, "team-a", honest.Node)
	w.record(model, convA[:1], "team-a", bad.Node)
	w.record(model, convB, "team-b", honest.Node)
	p.sent(honest, "team-a", convA...)
	p.sent(honest, "team-b", convB...)

	poller := pollAgent(t, index, bad, w.cold)

	skipped := func() float64 {
		return testutil.ToFloat64(w.skipped.WithLabelValues(bad.Node, peerfetch.RewarmTooSoon))
	}
	testenv.Eventually(t, 20*time.Second, 5*time.Millisecond, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return (polls >= 30 && skipped() >= 20) || warmups > 1,
			fmt.Sprintf("%d polls answered with a fresh epoch, %v skipped, %d warm-ups", polls, skipped(), warmups)
	})
	poller.Close()
	mu.Lock()
	defer mu.Unlock()
	if warmups > 1 {
		t.Errorf("%d fresh epochs earned %d warm-ups, want one", polls, warmups)
	}
	for _, h := range hints {
		c, err := pki.VerifyTicket(h.Ticket, pki.Pool([]*x509.Certificate{ca.Cert}), t0.Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if c.Partition != "team-a" {
			t.Errorf("the Mac got a ticket for %s's state %s in partition %q, which it never served", c.Source, c.Digest, c.Partition)
		}
	}
}

// TestAttackOneRequestEarnsThePartition: a compromised Mac (mac-evil) holding a
// replica of a deployment granted to team-a and team-b is routed one request of
// team-b, then reports a cold runner to be warmed. team-b's two other conversations,
// routed to the honest Mac, are in the same partition. On main the warm-up was
// filtered by partition: the one request earned tickets for both other
// conversations' states (up to 64 of a partition's conversations every 10 minutes).
// Now the cold Mac is warmed only with the chain it was itself sent.
func TestAttackOneRequestEarnsThePartition(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p, index, reg, ca := newTestPeerFetcher(t, t0)
	const model = "team-a/chat"
	p.est.ObservePrefill(model, 1000, time.Minute)
	honest := Backend{Key: "team-a/chat-0", Endpoint: "10.0.0.1:8443", Node: "mac-1", Slots: 2}
	bad := Backend{Key: "team-a/chat-1", Endpoint: "10.0.0.66:8443", Node: "mac-evil", Slots: 2}
	table := routing.TableOf(&Route{Namespace: "team-a", Deployment: "chat", PeerWarmup: true, Backends: []Backend{honest, bad}})
	sent := []string{"00000000000000b0", "00000000000000b1"}                             // the request routed to mac-evil
	others := [][]string{{"00000000000000c0", "00000000000000c1"}, {"00000000000000d0"}} // team-b's others
	index.Apply(honest.Key, runnerapi.PrefixEvents{Epoch: "e", Seq: 1, Reset: true, Events: []runnerapi.PrefixEvent{
		{Digest: sent[1], Tier: runnerapi.TierHot, Tokens: 1500},
		{Digest: others[0][1], Tier: runnerapi.TierHot, Tokens: 4000}, {Digest: others[1][0], Tier: runnerapi.TierHot, Tokens: 3000}}})

	var mu sync.Mutex
	var hints []runnerapi.PeerStateHint
	post := func(_ context.Context, be Backend, req runnerapi.PeerWarmRequest) (runnerapi.PeerWarmResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		hints = append(hints, req.Hints...)
		return runnerapi.PeerWarmResponse{Results: make([]runnerapi.PeerStateResult, len(req.Hints))}, nil
	}
	w, err := newWarmer(p, func() *Table { return table }, post, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)
	// What the gateway routed: team-b's conversations to the honest Mac, and the
	// first turn of one of them (its system prompt and first message) to mac-evil.
	for _, c := range append([][]string{sent}, others...) {
		w.record(model, c, "team-b", honest.Node)
		p.sent(honest, "team-b", c...)
	}
	w.record(model, sent, "team-b", bad.Node)
	p.sent(bad, "team-b", sent...)

	w.cold(prefixindex.Target{Key: bad.Key, Endpoint: bad.Endpoint, Node: bad.Node}, "fresh")
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		nothing := testutil.ToFloat64(w.skipped.WithLabelValues(bad.Node, nothingToWarm))
		mu.Lock()
		defer mu.Unlock()
		return len(hints) > 0 || nothing > 0, fmt.Sprintf("%d hints, %v nothing to warm", len(hints), nothing)
	})
	w.close() // waits for the warm-up under way
	mu.Lock()
	defer mu.Unlock()
	var got []string
	for _, h := range hints {
		c, err := pki.VerifyTicket(h.Ticket, pki.Pool([]*x509.Certificate{ca.Cert}), t0.Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c.Partition+"/"+c.Digest)
	}
	if want := []string{"team-b/" + sent[1]}; !slices.Equal(got, want) {
		t.Errorf("one routed request of team-b earned mac-evil tickets for %v, want %v (the chain it was sent)", got, want)
	}
}

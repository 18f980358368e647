package gateway

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/peerfetch"
	"github.com/macfleet/macfleet/gateway/prefixindex"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestWarmerWarmsAColdReplica: a replica that starts cold (mac-2) is asked to fetch,
// from the replica on another Mac (mac-1), the deepest digest it holds of each
// conversation routed lately to mac-2 itself, each with a ticket for that state in
// the conversation's own partition; not the turns of it mac-2 was never sent, not what
// a replica on its own Mac holds, nor a partition only mac-1 served. It is asked once per runner epoch, a new epoch
// only once the re-warm interval has passed, and its answers are counted as warm-ups
// and as peer fetches.
func TestWarmerWarmsAColdReplica(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p, index, reg, ca := newTestPeerFetcher(t, t0)
	var clock atomic.Int64 // the warmer's goroutine reads the time
	clock.Store(t0.UnixNano())
	p.now = func() time.Time { return time.Unix(0, clock.Load()).UTC() }
	const model = "team-a/chat"
	p.est.ObservePrefill(model, 1000, time.Minute) // slow enough that the default link is worth it
	r1 := Backend{Key: "team-a/chat-0", Endpoint: "10.0.0.1:8443", Node: "mac-1", Slots: 2}
	r2 := Backend{Key: "team-a/chat-1", Endpoint: "10.0.0.2:8443", Node: "mac-2", Slots: 2}
	r3 := Backend{Key: "team-a/chat-2", Endpoint: "10.0.0.2:8443", Node: "mac-2", Slots: 2}
	table := routing.TableOf(&Route{Namespace: "team-a", Deployment: "chat", PeerWarmup: true, Backends: []Backend{r1, r2, r3}})
	convA := []string{"000000000000000a", "000000000000000b", "000000000000000c"}
	convB := []string{"00000000000000d1", "00000000000000d2"}
	convC := []string{"00000000000000e1"}
	held := func(key string, events ...runnerapi.PrefixEvent) {
		index.Apply(key, runnerapi.PrefixEvents{Epoch: "e", Seq: 1, Reset: true, Events: events})
	}
	held(r1.Key, runnerapi.PrefixEvent{Digest: convA[1], Tier: runnerapi.TierHot, Tokens: 2000},
		runnerapi.PrefixEvent{Digest: convA[2], Tier: runnerapi.TierHot, Tokens: 2500},
		runnerapi.PrefixEvent{Digest: convB[1], Tier: runnerapi.TierSSD, Tokens: 3000})
	held(r3.Key, runnerapi.PrefixEvent{Digest: convC[0], Tier: runnerapi.TierHot, Tokens: 5000}) // r2's own Mac: not a peer

	var mu sync.Mutex
	var asked []runnerapi.PeerWarmRequest
	post := func(_ context.Context, be Backend, req runnerapi.PeerWarmRequest) (runnerapi.PeerWarmResponse, error) {
		if be != r2 {
			return runnerapi.PeerWarmResponse{}, fmt.Errorf("asked %v, want r2", be)
		}
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, req)
		out := runnerapi.PeerWarmResponse{}
		for _, h := range req.Hints {
			out.Results = append(out.Results, runnerapi.PeerStateResult{Imported: true, Tokens: h.Tokens, Bytes: int64(h.Tokens) * 1000, Millis: 50})
		}
		return out, nil
	}
	calls := func() []runnerapi.PeerWarmRequest {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(asked)
	}
	w, err := newWarmer(p, func() *Table { return table }, post, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)
	w.record(model, convA, "team-a", r1.Node)
	w.record(model, convB, "team-b", r1.Node)
	w.record(model, convC, "team-a", r3.Node)
	w.record(model, convA[:2], "team-a", r3.Node) // mac-2 was sent convA's first two turns
	// What the gateway sent each replica (the requests recorded above).
	p.sent(r1, "team-a", convA...)
	p.sent(r1, "team-b", convB...)
	p.sent(r3, "team-a", convC...)
	p.sent(r3, "team-a", convA[:2]...)

	target := prefixindex.Target{Key: r2.Key, Endpoint: r2.Endpoint, Node: r2.Node}
	w.cold(target, "e1")
	w.cold(target, "e1")
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return len(calls()) == 1, fmt.Sprintf("%d warm-ups asked, want 1", len(calls()))
	})
	type claim struct{ digest, partition string }
	var got []claim
	for _, h := range calls()[0].Hints {
		c, err := pki.VerifyTicket(h.Ticket, pki.Pool([]*x509.Certificate{ca.Cert}), t0.Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if c.Target != "mac-2" || c.Source != "mac-1" || c.Model != r1.Key || c.Digest != h.Digest || h.Model != r1.Key ||
			h.Agent != "https://"+r1.Endpoint {
			t.Errorf("hint %+v with ticket %+v; want a fetch of r1's %s by mac-2 from mac-1", h, c, h.Digest)
		}
		got = append(got, claim{c.Digest, c.Partition})
	}
	if want := []claim{{convA[1], "team-a"}}; !slices.Equal(got, want) {
		t.Fatalf("warmed %v, want %v (the turns of team-a's conversation mac-2 was sent; nothing of r2's own Mac, nothing of team-b)", got, want)
	}
	w.cold(target, "e2")
	if n := testutil.ToFloat64(w.skipped.WithLabelValues("mac-2", "replica_rewarmed")); n != 1 {
		t.Errorf("a new epoch at once: %v skipped, want 1", n)
	}
	clock.Store(t0.Add(peerfetch.DefaultRewarmInterval).UnixNano())
	w.record(model, convA[:2], "team-a", r3.Node) // sent again within the maximum age
	w.cold(target, "e3")
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		return len(calls()) == 2, fmt.Sprintf("%d warm-ups asked, want a second for the new epoch", len(calls()))
	})
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		n := testutil.ToFloat64(w.warmups.WithLabelValues(model, "imported"))
		f := testutil.ToFloat64(p.fetches.WithLabelValues(model, "imported"))
		return n == 2 && f == 2, fmt.Sprintf("%v warm-ups and %v peer fetches counted imported, want 2 each", n, f)
	})
}

// TestWarmerSkipsDeploymentsNotOptedIn: a cold replica of a deployment that did not
// opt in to peer warm-up (Route.PeerWarmup false, the default) earns no warm-up and no
// ticket, though its Mac served the partition of a state a peer holds: the epoch is
// counted as not_enabled and uses none of the limiter's warm-ups. Once the deployment
// opts in, the replica's next epoch is warmed at once (the limiter saw nothing), and
// the only request its agent was sent is that one.
func TestWarmerSkipsDeploymentsNotOptedIn(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p, index, reg, _ := newTestPeerFetcher(t, t0)
	p.now = func() time.Time { return t0 }
	const model = "team-a/chat"
	p.est.ObservePrefill(model, 1000, time.Minute)
	r1 := Backend{Key: "team-a/chat-0", Endpoint: "10.0.0.1:8443", Node: "mac-1", Slots: 2}
	r2 := Backend{Key: "team-a/chat-1", Endpoint: "10.0.0.2:8443", Node: "mac-2", Slots: 2}
	conv := []string{"000000000000000a", "000000000000000b"}
	index.Apply(r1.Key, runnerapi.PrefixEvents{Epoch: "e", Seq: 1, Reset: true,
		Events: []runnerapi.PrefixEvent{{Digest: conv[1], Tier: runnerapi.TierHot, Tokens: 2000}}})
	var table atomic.Pointer[Table]
	tableOf := func(optIn bool) *Table {
		tb := routing.TableOf(&Route{Namespace: "team-a", Deployment: "chat", PromptCache: true, PeerWarmup: optIn, Backends: []Backend{r1, r2}})
		return tb
	}
	table.Store(tableOf(false))
	var mu sync.Mutex
	var hints []runnerapi.PeerStateHint
	var posts int
	post := func(_ context.Context, _ Backend, req runnerapi.PeerWarmRequest) (runnerapi.PeerWarmResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		posts++
		hints = append(hints, req.Hints...)
		return runnerapi.PeerWarmResponse{Results: make([]runnerapi.PeerStateResult, len(req.Hints))}, nil
	}
	w, err := newWarmer(p, table.Load, post, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)
	w.record(model, conv, "team-a", r1.Node)
	w.record(model, conv, "team-a", r2.Node) // mac-2 served team-a too
	p.sent(r1, "team-a", conv...)

	target := prefixindex.Target{Key: r2.Key, Endpoint: r2.Endpoint, Node: r2.Node}
	w.cold(target, "e1")
	if n := testutil.ToFloat64(w.skipped.WithLabelValues("mac-2", notEnabled)); n != 1 {
		t.Errorf("a cold epoch of a deployment not opted in: %v counted not_enabled, want 1", n)
	}
	table.Store(tableOf(true))
	w.cold(target, "e2")
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return posts == 1, fmt.Sprintf("%d warm-ups asked, want 1 (the opted-in epoch's)", posts)
	})
	mu.Lock()
	defer mu.Unlock()
	if len(hints) != 1 || hints[0].Digest != conv[1] {
		t.Errorf("warmed with %+v, want one hint for %s", hints, conv[1])
	}
	if n := testutil.ToFloat64(w.skipped.WithLabelValues("mac-2", "replica_rewarmed")); n != 0 {
		t.Errorf("the opted-in epoch counted %v replica_rewarmed: the skipped one used the limiter", n)
	}
}

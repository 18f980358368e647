package gateway

import (
	"crypto/x509"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/peerfetch"
	"github.com/macfleet/macfleet/gateway/prefixindex"
	"github.com/macfleet/macfleet/internal/pki"
)

// newGatewayCA is a new fleet CA made at t0 and a certificate of gateway gw-0 of it.
func newGatewayCA(t *testing.T, t0 time.Time) (*pki.CA, *pki.Source) {
	t.Helper()
	ca, err := pki.NewCA(t0, pki.DefaultCALifetime)
	if err != nil {
		t.Fatal(err)
	}
	gw := pki.Gateway("gw-0")
	certs, err := ca.NewSource(&gw, t0, pki.DefaultLeafLifetime)
	if err != nil {
		t.Fatal(err)
	}
	return ca, certs
}

// newTestPeerFetcher is a gateway's peer fetch with a certificate of gw-0 of a new
// fleet CA (returned), an empty prefix index and a registry of its own, its clock
// stopped at t0.
func newTestPeerFetcher(t *testing.T, t0 time.Time) (*peerFetcher, *prefixindex.Index, *prometheus.Registry, *pki.CA) {
	t.Helper()
	ca, certs := newGatewayCA(t, t0)
	index, err := prefixindex.New(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p, err := newPeerFetcher(Options{AgentCertificates: certs, Registerer: reg, Log: logr.Discard()}, index, "https://")
	if err != nil || p == nil {
		t.Fatalf("newPeerFetcher = %v, %v", p, err)
	}
	p.now = func() time.Time { return t0 }
	return p, index, reg, ca
}

// TestPeerFetchHint: the gateway asks replica R (mac-2) to fetch a prefix from the
// replica on another Mac that holds the deepest of the request's digests (mac-1,
// not R's neighbour on mac-2), with a ticket that grants exactly that; not when R
// holds as much, no prefill rate is measured yet, or the deployment has no replica
// elsewhere; and R's report feeds the counters and the estimates.
func TestPeerFetchHint(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p, index, reg, ca := newTestPeerFetcher(t, t0)
	digests := []string{"000000000000000a", "000000000000000b", "000000000000000c"}
	held := func(key string, depth, tokens int, tier string) {
		var ev []runnerapi.PrefixEvent
		for i := range depth {
			ev = append(ev, runnerapi.PrefixEvent{Digest: digests[i], Tier: tier, Tokens: tokens * (i + 1) / depth})
		}
		index.Apply(key, runnerapi.PrefixEvents{Epoch: "e", Seq: 1, Reset: true, Events: ev})
	}
	r1 := Backend{Key: "team-a/chat-0", Endpoint: "10.0.0.1:8443", Node: "mac-1", Slots: 2}
	r2 := Backend{Key: "team-a/chat-1", Endpoint: "10.0.0.2:8443", Node: "mac-2", Slots: 2}
	r3 := Backend{Key: "team-a/chat-2", Endpoint: "10.0.0.2:8443", Node: "mac-2", Slots: 2}
	rt := &Route{Namespace: "team-a", Deployment: "chat", Backends: []Backend{r1, r2, r3}}
	const model = "team-a/chat"
	held(r1.Key, 3, 3000, runnerapi.TierSSD)
	held(r2.Key, 1, 1000, runnerapi.TierHot)
	held(r3.Key, 3, 3000, runnerapi.TierHot) // on R's own Mac: not a peer
	// The gateway sent r1 this conversation (and r3); a state is fetched only from a
	// replica that was sent its prefix (TestAttackForgedStateOfAPrefixNeverSent).
	p.sent(r1, "team-a", digests...)
	p.sent(r3, "team-a", digests...)
	ask := func(be Backend, rt *Route) (*peerSource, runnerapi.PeerStateHint) {
		t.Helper()
		out, _ := http.NewRequest(http.MethodPost, "https://"+be.Endpoint+"/v1/chat/completions", nil)
		src := p.hint(out, rt, model, be, prefixAsk{digests: digests, partition: "team-a"})
		var h runnerapi.PeerStateHint
		if v := out.Header.Get(runnerapi.HeaderPeerState); v != "" {
			if err := json.Unmarshal([]byte(v), &h); err != nil {
				t.Fatal(err)
			}
		}
		if (src == nil) != (h.Ticket == "") {
			t.Fatalf("hint returned %v but the header is %+v", src, h)
		}
		return src, h
	}
	decisions := func(d string) float64 { return testutil.ToFloat64(p.decisions.WithLabelValues(model, d)) }

	if src, _ := ask(r2, rt); src != nil || decisions(peerfetch.ReasonNoPrefill) != 1 {
		t.Fatalf("before any prefill was measured: hinted %v (no_prefill_rate decisions %v)", src, decisions(peerfetch.ReasonNoPrefill))
	}
	// A prefill of 2000 tokens in 20 s: 100 tokens/s, slow next to fetching 2000
	// tokens (250 MiB at the default 128 KiB a token) over an unmeasured link (5.3 s).
	p.observePrefill(model, &metering.Usage{Input: 2100, Cached: 100}, 20*time.Second)
	src, h := ask(r2, rt)
	if src == nil || src.be.Key != r1.Key {
		t.Fatalf("hinted %+v, want the replica on mac-1", src)
	}
	want := runnerapi.PeerStateHint{Agent: "https://10.0.0.1:8443", Model: r1.Key, Digest: digests[2], Tokens: 2000, Ticket: h.Ticket}
	if d := cmp.Diff(want, h); d != "" {
		t.Fatalf("hint (-want +got):\n%s", d)
	}
	tk, err := pki.VerifyTicket(h.Ticket, pki.Pool([]*x509.Certificate{ca.Cert}), t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Grants("mac-2", "mac-1", r1.Key, digests[2]); err != nil || tk.Partition != "team-a" || tk.Expires != t0.Add(TicketLifetime) {
		t.Fatalf("ticket %+v: %v; want mac-2 fetching %s of %s from mac-1 in team-a's partition until %v", tk, err, digests[2], r1.Key, t0.Add(TicketLifetime))
	}
	// R (mac-1) holds the deepest itself: nothing to fetch.
	if src, _ := ask(r1, rt); src != nil {
		t.Fatalf("a replica holding the deepest digest was hinted to fetch from %v", src.be.Key)
	}
	// A deployment whose other replicas are all on R's Mac: no peer.
	if src, _ := ask(r2, &Route{Backends: []Backend{r2, r3}}); src != nil {
		t.Fatalf("hinted a fetch from %v on the same Mac", src.be.Key)
	}

	// R's report: an import of 2000 tokens in 8 MB over 220 ms.
	h2 := http.Header{}
	h2.Set(runnerapi.HeaderPeerRestore, `{"imported":true,"tokens":2000,"bytes":8000000,"ms":220}`)
	p.report(model, r2, src, h2)
	h2.Set(runnerapi.HeaderPeerRestore, `{"imported":false,"reason":"not_found","ms":4}`)
	p.report(model, r2, src, h2)
	p.report(model, r2, src, http.Header{}) // an agent without peer fetch: nothing
	if got := testutil.ToFloat64(p.bytes.WithLabelValues(model)); got != 8e6 {
		t.Errorf("bytes moved = %v, want 8e6", got)
	}
	for result, n := range map[string]float64{"imported": 1, runnerapi.PeerMissNotFound: 1} {
		if got := testutil.ToFloat64(p.fetches.WithLabelValues(model, result)); got != n {
			t.Errorf("fetches{result=%s} = %v, want %v", result, got, n)
		}
	}
	in := p.est.Inputs(model, peerfetch.LinkKey{Source: "mac-1", Target: "mac-2"}, 2000, 0, peerfetch.Prior{})
	if in.BytesPerToken != 4000 || in.Link.Throughput != 8e6/0.2 || in.Link.RTT != 4*time.Millisecond {
		t.Errorf("estimates after the reports: %+v; want 4000 bytes/token, 40 MB/s (8 MB over 220 ms less the default 20 ms RTT), RTT 4 ms", in)
	}
	if n, err := testutil.GatherAndCount(reg, "macfleet_gateway_peer_fetch_bytes_total", "macfleet_gateway_peer_fetches_total"); err != nil || n != 3 {
		t.Errorf("the registry holds %d peer fetch series (%v), want 3", n, err)
	}
}

// TestPeerFetchOff: no peer fetch without prefix-cache routing, when disabled, or
// without a certificate to sign tickets with.
func TestPeerFetchOff(t *testing.T) {
	index, err := prefixindex.New(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, certs := newGatewayCA(t, time.Now())
	for name, tc := range map[string]struct {
		opts  Options
		index *prefixindex.Index
	}{
		"another routing": {opts: Options{AgentCertificates: certs}},
		"disabled":        {opts: Options{AgentCertificates: certs, DisablePeerFetch: true}, index: index},
		"no certificate":  {opts: Options{}, index: index},
	} {
		tc.opts.Registerer = prometheus.NewRegistry()
		if p, err := newPeerFetcher(tc.opts, tc.index, "https://"); p != nil || err != nil {
			t.Errorf("%s: newPeerFetcher = %v, %v; want off", name, p, err)
		}
	}
}

// TestPeerFetchPrior: before any fetch is measured, the gateway decides on the bytes
// per token the holder's runner reports with its prefix events and the link the Macs
// declare. A 4 k-token prefix prefilled at 1,000 tokens/s (4 s) is not fetched at the
// defaults (128 KiB a token, 50 MB/s: 10.7 s), is once P's runner reports 256 bytes a
// token (about 40 ms), and is not again when the Macs declare a slow link.
func TestPeerFetchPrior(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p, index, _, _ := newTestPeerFetcher(t, t0)
	digests := []string{"000000000000000a"}
	const model = "team-a/chat"
	r1 := Backend{Key: "team-a/chat-0", Endpoint: "10.0.0.1:8443", Node: "mac-1", Slots: 2}
	r2 := Backend{Key: "team-a/chat-1", Endpoint: "10.0.0.2:8443", Node: "mac-2", Slots: 2}
	slow := peerfetch.DeclaredLink(1e6, 0) // 1 Mb/s
	p.observePrefill(model, &metering.Usage{Input: 4096}, 4096*time.Millisecond)
	held := func(bpt float64) {
		index.Apply(r1.Key, runnerapi.PrefixEvents{Epoch: "e", Seq: 1, Reset: true, BytesPerToken: bpt,
			Events: []runnerapi.PrefixEvent{{Digest: digests[0], Tier: runnerapi.TierHot, Tokens: 4096}}})
	}
	for _, tc := range []struct {
		name       string
		bpt        float64
		src, dst   peerfetch.Link
		wantReason string
	}{
		{name: "nothing reported: the defaults", wantReason: peerfetch.ReasonSlower},
		{name: "P's runner reports 256 bytes a token", bpt: 256, wantReason: peerfetch.ReasonFaster},
		{name: "reported, but one Mac declares a 1 Mb/s link", bpt: 256, dst: slow, wantReason: peerfetch.ReasonSlower},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held(tc.bpt)
			src, dst := r1, r2
			p.sent(src, "team-a", digests...)
			src.Link, dst.Link = tc.src, tc.dst
			rt := &Route{Namespace: "team-a", Deployment: "chat", Backends: []Backend{src, dst}}
			before := testutil.ToFloat64(p.decisions.WithLabelValues(model, tc.wantReason))
			out, _ := http.NewRequest(http.MethodPost, "https://"+dst.Endpoint+"/v1/chat/completions", nil)
			hinted := p.hint(out, rt, model, dst, prefixAsk{digests: digests, partition: "team-a"}) != nil
			if got := testutil.ToFloat64(p.decisions.WithLabelValues(model, tc.wantReason)); got != before+1 || hinted != (tc.wantReason == peerfetch.ReasonFaster) {
				t.Errorf("hinted %v, %s decisions %v → %v; want one %s", hinted, tc.wantReason, before, got, tc.wantReason)
			}
		})
	}
}

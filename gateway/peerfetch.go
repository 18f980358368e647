package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/peerfetch"
	"github.com/macfleet/macfleet/gateway/prefixindex"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/tunnel"
)

// TicketLifetime is how long a state ticket the gateway signs is valid: the fetching
// agent uses it at once, and gives up after runnerapi.PeerFetchTimeoutSeconds.
const TicketLifetime = 20 * time.Second

// peerFetcher is the gateway's side of peer fetch (api/runnerapi/peerstate.go): when
// a request goes to a replica that holds less of its prefix than a replica of the
// same deployment on another Mac, and peerfetch.Decide says fetching is faster than
// prefilling, the request carries a hint and a ticket to fetch the state first; the
// agent's report on the answer feeds the measurements and the counters.
type peerFetcher struct {
	index  *prefixindex.Index
	certs  *pki.Source
	scheme string
	margin float64
	est    *peerfetch.Estimates
	// vouched: the prefixes each replica was sent, the only ones fetched from it.
	vouched *peerfetch.Vouched
	now     func() time.Time
	log     logr.Logger
	// tunnels are the connections of Macs that dial out (nil without any): a Mac
	// holding one fetches through the gateway, a Mac that dials out is fetched from
	// only that way (reaches).
	tunnels *tunnel.Sessions

	decisions *prometheus.CounterVec
	fetches   *prometheus.CounterVec
	bytes     *prometheus.CounterVec
}

// newPeerFetcher is the gateway's peer fetch, or nil when it is off: another routing
// than prefix-cache, Options.DisablePeerFetch, or no fleet certificate to sign
// tickets with (agents over plain HTTP).
func newPeerFetcher(opts Options, index *prefixindex.Index, scheme string) (*peerFetcher, error) {
	if index == nil || opts.DisablePeerFetch || opts.AgentCertificates == nil {
		return nil, nil
	}
	p := &peerFetcher{index: index, certs: opts.AgentCertificates, scheme: scheme, margin: opts.PeerFetchMargin,
		est: peerfetch.NewEstimates(), vouched: peerfetch.NewVouched(0), now: time.Now, log: opts.Log.WithName("peerfetch"), tunnels: opts.Tunnels,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_gateway_peer_fetch_decisions_total",
			Help: "Requests routed to a replica that holds less of their prefix than one on another Mac, by deployment and decision " +
				"(faster: a fetch was asked; slower, few_tokens, no_prefill_rate, not_measured: prefilled).",
		}, []string{"model", "decision"}),
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_gateway_peer_fetches_total",
			Help: "Peer fetches the agents reported on their answers and for warm-ups, by deployment and result (imported, or the miss reason).",
		}, []string{"model", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_gateway_peer_fetch_bytes_total",
			Help: "Bytes of prompt state moved between Macs by the peer fetches (warm-ups included) the gateway asked for, by deployment.",
		}, []string{"model"}),
	}
	for _, c := range []**prometheus.CounterVec{&p.decisions, &p.fetches, &p.bytes} {
		got, err := register(opts.Registerer, *c)
		if err != nil {
			return nil, err
		}
		*c = got.(*prometheus.CounterVec)
	}
	return p, nil
}

// peerSource is the replica a hint names and the link it is fetched over.
type peerSource struct {
	be  Backend
	hit prefixindex.Hit
}

// vouchKey is the replica's key in p.vouched: its Mac's name with it, so that a
// replica of the same name on another Mac starts with nothing.
func vouchKey(be Backend) string { return be.Key + "@" + be.Node }

// sent records that replica be is sent the prefixes digests of partition: a request
// routed to it, or a ticket to fetch their state.
func (p *peerFetcher) sent(be Backend, partition string, digests ...string) {
	p.vouched.Vouch(vouchKey(be), partition, digests...)
}

// peerHit is what replica o holds of digests (the index's Deepest) among the prefixes
// it was sent in partition: the index says what its Mac claims to hold, and a Mac
// could claim a prefix it never computed to serve forged state for it.
func (p *peerFetcher) peerHit(o Backend, partition string, digests []string) prefixindex.Hit {
	return p.index.Deepest(o.Key, digests[:p.vouched.Depth(vouchKey(o), partition, digests)])
}

// prefixAsk is what a request asks of the peer fetcher: its prefix's routable digests,
// the cache partition they are of, and the replicas a stream it continues broke on.
type prefixAsk struct {
	digests   []string
	partition string
	broken    []string
}

// holder is the replica of rt on another Mac than be's, and not one of ask.broken,
// that holds the deepest of ask's digests of its partition it was sent (peerHit), when
// it holds more than be does; ok false otherwise.
func (p *peerFetcher) holder(rt *Route, be Backend, ask prefixAsk) (src peerSource, tokens int, ok bool) {
	own := p.index.Deepest(be.Key, ask.digests)
	for _, o := range rt.Backends {
		if o.Node == "" || o.Node == be.Node || o.Key == be.Key || slices.Contains(ask.broken, o.Key) || !p.reaches(o, be) {
			continue
		}
		hit := p.peerHit(o, ask.partition, ask.digests)
		if hit.Depth > src.hit.Depth || (hit.Depth == src.hit.Depth && hit.Depth > 0 && routing.TierWeight(hit.Tier) > routing.TierWeight(src.hit.Tier)) {
			src = peerSource{be: o, hit: hit}
		}
	}
	if src.hit.Depth <= own.Depth {
		return peerSource{}, 0, false
	}
	return src, src.hit.Tokens - own.Tokens, true
}

// hint adds runnerapi.HeaderPeerState to out, the request to replica be of rt, when
// a replica on another Mac holds more of its prefix and fetching is decided faster;
// the source it names, for report, or nil. It records the request's prefixes as sent
// to be. ask.broken are the replicas a stream this request continues broke on: never
// a source (their runner died, or their agent or Mac is gone, and a fetch from them
// would fail only after its timeout, at the seam), though the deepest holders.
func (p *peerFetcher) hint(out *http.Request, rt *Route, model string, be Backend, ask prefixAsk) *peerSource {
	digests, partition := ask.digests, ask.partition
	if len(digests) == 0 || be.Node == "" {
		return nil
	}
	p.sent(be, partition, digests...)
	src, tokens, ok := p.holder(rt, be, ask)
	if !ok {
		return nil
	}
	d := peerfetch.Decide(p.est.Inputs(model, peerfetch.LinkKey{Source: src.be.Node, Target: be.Node}, tokens, p.margin, p.prior(src.be, be)))
	p.decisions.WithLabelValues(model, d.Reason).Inc()
	if !d.Fetch {
		return nil
	}
	h, err := p.signHint(out.Context(), src.be, be, digests[src.hit.Depth-1], partition, tokens)
	if err != nil {
		p.log.Error(err, "Signing a state ticket; the request is prefilled", "model", model)
		return nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil
	}
	out.Header.Set(runnerapi.HeaderPeerState, string(b))
	p.log.V(2).Info("Asking for a peer fetch", "model", model, "replica", be.Key, "from", src.be.Key, "tokens", tokens,
		"transfer", d.Transfer, "prefill", d.Prefill)
	return &src
}

// prior is what is known of a fetch from src into target before one is measured: the
// bytes per token src's runner reports (else target's) and the link their Macs
// declare.
func (p *peerFetcher) prior(src, target Backend) peerfetch.Prior {
	bpt := p.index.BytesPerToken(src.Key)
	if bpt <= 0 {
		bpt = p.index.BytesPerToken(target.Key)
	}
	return peerfetch.Prior{BytesPerToken: bpt, Link: peerfetch.PairLink(src.Link, target.Link)}
}

// route is how target's Mac fetches from src's (tunnel.PeerRoute): through the
// gateway replicas when both Macs hold a tunnel (to this replica or another: the
// grant goes to the replica target's tunnel is on); ok false when src's Mac dials out
// and target's would have to dial it.
func (p *peerFetcher) route(src, target Backend) (viaGateway, ok bool) {
	if p.tunnels == nil {
		return false, true
	}
	return tunnel.PeerRoute(p.tunnels.Reaches(src.Node), p.tunnels.Reaches(target.Node))
}

// reaches says whether target's Mac can fetch from src's at all.
func (p *peerFetcher) reaches(src, target Backend) bool {
	_, ok := p.route(src, target)
	return ok
}

// grantTimeout bounds giving another gateway replica the grant of a fetch through it.
const grantTimeout = 2 * time.Second

// signHint is the hint for target's Mac to fetch digest (of partition, sparing
// tokens) from replica src, with a ticket valid for TicketLifetime from now.
func (p *peerFetcher) signHint(ctx context.Context, src, target Backend, digest, partition string, tokens int) (runnerapi.PeerStateHint, error) {
	now := p.now()
	ticket, err := pki.SignTicket(pki.StateTicket{Target: target.Node, Source: src.Node, Model: src.Key, Digest: digest,
		Partition: partition, Issued: now, Expires: now.Add(TicketLifetime)}, p.certs.Certificate())
	if err != nil {
		return runnerapi.PeerStateHint{}, err
	}
	if via, _ := p.route(src, target); via {
		// The fetch goes through target's tunnel: the replica it is on joins it to src's.
		gctx, cancel := context.WithTimeout(ctx, grantTimeout)
		defer cancel()
		if err := p.tunnels.Grant(gctx, target.Node, src.Node, now.Add(TicketLifetime)); err != nil {
			return runnerapi.PeerStateHint{}, fmt.Errorf("granting %s's fetch from %s through the gateway replicas: %w", target.Node, src.Node, err)
		}
	}
	return runnerapi.PeerStateHint{Agent: p.scheme + src.Endpoint, Model: src.Key, Digest: digest, Tokens: tokens, Ticket: ticket}, nil
}

// report reads the agent's runnerapi.HeaderPeerRestore on the answer of replica be
// to a request hinted to fetch from src: the measurements and the counters.
func (p *peerFetcher) report(model string, be Backend, src *peerSource, h http.Header) {
	var res runnerapi.PeerStateResult
	v := h.Get(runnerapi.HeaderPeerRestore)
	if v == "" || json.Unmarshal([]byte(v), &res) != nil {
		return // an agent without peer fetch
	}
	p.count(model, src.be, be, res)
}

// count is one fetch's outcome, from replica src into replica be: the counters and
// the estimates. It returns the result label (imported, or the miss reason).
func (p *peerFetcher) count(model string, src, be Backend, res runnerapi.PeerStateResult) string {
	result := res.Reason
	if res.Imported {
		result = "imported"
	}
	p.fetches.WithLabelValues(model, result).Inc()
	p.bytes.WithLabelValues(model).Add(float64(max(res.Bytes, 0)))
	p.est.ObserveFetch(model, peerfetch.LinkKey{Source: src.Node, Target: be.Node}, res, peerfetch.PairLink(src.Link, be.Link))
	return result
}

// observePrefill samples model's prefill rate from a streamed answer that fetched
// nothing: the tokens its usage says were prefilled (prompt less cached), over the
// time from sending the request to its first byte.
func (p *peerFetcher) observePrefill(model string, u *metering.Usage, firstByte time.Duration) {
	if u == nil || firstByte <= 0 {
		return
	}
	p.est.ObservePrefill(model, int(u.Input-u.Cached), firstByte)
}

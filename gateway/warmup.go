package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/peerfetch"
	"github.com/macfleet/macfleet/gateway/prefixindex"
)

// Warm-up bounds of the gateway's side.
const (
	// warmBatch is how many hints one warm-up request carries: their tickets are
	// signed just before it is sent, and each fetch takes at most
	// runnerapi.PeerFetchTimeoutSeconds, so the last hint's ticket is rarely past
	// TicketLifetime when its fetch begins (one that is is a refused miss).
	warmBatch = 4
	// warmQueue bounds the cold replicas waiting for a warm-up; more are dropped
	// (logged): the gateway warms one replica at a time.
	warmQueue = 64
	// maxWarmed bounds the replicas whose warmed epoch is remembered; past it the
	// record starts over (a replica might then be warmed again, once).
	maxWarmed = 4096
)

// Reasons a cold epoch earned no warm-up (beside peerfetch.WarmLimiter's).
const (
	// nothingToWarm: its warm-up found no state to fetch.
	nothingToWarm = "nothing_to_warm"
	// notEnabled: its deployment did not opt in (spec.engine.promptCache.peerWarmup).
	notEnabled = "not_enabled"
)

// warmPost asks replica be's agent to warm up (Gateway.postWarm).
type warmPost func(ctx context.Context, be Backend, req runnerapi.PeerWarmRequest) (runnerapi.PeerWarmResponse, error)

// warmer warms replicas that start cold (prefixindex.Poller.OnCold: a new replica, a
// rescheduled one, a restarted runner) from the replicas of their deployment on other
// Macs, in the background, never on a request's path: once per replica and runner
// epoch, and no more often than peerfetch.WarmLimiter allows (a Mac that reports a
// fresh epoch on every poll earns no warm-up on every poll), one replica at a time, it
// picks the states worth fetching (peerfetch.ChooseWarmups over the conversations
// routed lately to the cold replica's Mac itself, peerfetch.Recent.SentTo)
// and asks the cold replica's agent to fetch them (POST /api/models/{id}/states/warm).
// It is part of peer fetch: off with it; and only deployments that opt in
// (spec.engine.promptCache.peerWarmup, Route.PeerWarmup) are warmed.
type warmer struct {
	p      *peerFetcher
	recent *peerfetch.Recent
	table  func() *Table
	post   warmPost

	warmups, skipped *prometheus.CounterVec
	queue            chan prefixindex.Target
	ctx              context.Context
	stop             context.CancelFunc
	// start starts the worker on the first cold replica (or, on close, marks done).
	start sync.Once
	done  chan struct{}

	mu     sync.Mutex
	warmed map[string]string // replica key → the runner epoch warmed
	limit  peerfetch.WarmLimiter
}

// newWarmer is the gateway's warmer over peer fetch p (nil when peer fetch is off:
// then nil too), the routing table and post, the call of an agent's warm-up; its
// worker starts with the first cold replica.
func newWarmer(p *peerFetcher, table func() *Table, post warmPost, reg prometheus.Registerer) (*warmer, error) {
	if p == nil {
		return nil, nil
	}
	w := &warmer{p: p, recent: peerfetch.NewRecent(0, 0), table: table, post: post,
		warmups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_gateway_peer_warmups_total",
			Help: "States the gateway asked cold replicas to fetch from other Macs to warm up, by deployment and result " +
				"(imported, or the miss reason); counted in macfleet_gateway_peer_fetches_total too.",
		}, []string{"model", "result"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_gateway_peer_warmups_skipped_total",
			Help: "Cold runner epochs that earned no warm-up, by Mac and reason (replica_rewarmed: the replica was warmed " +
				"less than 10 minutes ago; mac_rate_limited: its Mac had 4 warm-ups in the last 10 minutes; " +
				"nothing_to_warm: no state of a conversation its Mac was sent lately is worth fetching; " +
				"not_enabled: its deployment does not set spec.engine.promptCache.peerWarmup). " +
				"A Mac that keeps counting here reports cold runners again and again: a crashing runner, or a compromised Mac.",
		}, []string{"node", "reason"}),
		queue: make(chan prefixindex.Target, warmQueue), done: make(chan struct{}), warmed: map[string]string{}}
	for _, c := range []**prometheus.CounterVec{&w.warmups, &w.skipped} {
		got, err := register(reg, *c)
		if err != nil {
			return nil, err
		}
		*c = got.(*prometheus.CounterVec)
	}
	w.ctx, w.stop = context.WithCancel(context.Background())
	return w, nil
}

// close stops the warmer and waits for the warm-up under way.
func (w *warmer) close() {
	w.stop()
	w.start.Do(func() { close(w.done) })
	<-w.done
}

// record notes a request of partition with prefix digests routed to model, to a
// replica on Mac node.
func (w *warmer) record(model string, digests []string, partition, node string) {
	w.recent.Record(model, digests, partition, node, w.p.now())
}

// cold queues a warm-up of t (runner epoch epoch) unless one was queued for that
// epoch already, its deployment did not opt in, or the limiter refuses it (counted,
// and logged when refused). It never blocks.
func (w *warmer) cold(t prefixindex.Target, epoch string) {
	rt, _, routed := w.table().BackendOf(t.Key)
	w.mu.Lock()
	if w.warmed[t.Key] == epoch {
		w.mu.Unlock()
		return
	}
	if len(w.warmed) >= maxWarmed {
		clear(w.warmed)
	}
	w.warmed[t.Key] = epoch
	if routed && !rt.PeerWarmup {
		w.mu.Unlock()
		w.skipped.WithLabelValues(t.Node, notEnabled).Inc()
		return
	}
	ok, why := w.limit.Allow(t.Node, t.Key, w.p.now())
	w.mu.Unlock()
	if !ok {
		w.skipped.WithLabelValues(t.Node, why).Inc()
		w.p.log.Info("A replica reports a cold runner again; not warming it", "replica", t.Key, "node", t.Node,
			"epoch", epoch, "reason", why)
		return
	}
	w.start.Do(func() { go w.run(w.ctx) })
	select {
	case w.queue <- t:
	default:
		w.p.log.Info("Too many cold replicas waiting for a warm-up; this one starts cold", "replica", t.Key)
	}
}

func (w *warmer) run(ctx context.Context) {
	defer close(w.done)
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-w.queue:
			w.warm(ctx, t)
		}
	}
}

// warm warms replica t: the states peerfetch.ChooseWarmups picks, asked of its agent
// warmBatch at a time, each result counted.
func (w *warmer) warm(ctx context.Context, t prefixindex.Target) {
	rt, be, ok := w.table().BackendOf(t.Key)
	if !ok || !rt.PeerWarmup {
		return // gone, or its deployment opted out since it was queued
	}
	model := rt.ID()
	peers := map[string]Backend{}
	for _, o := range rt.Backends {
		peers[o.Key] = o
	}
	plan := peerfetch.ChooseWarmups(w.candidates(rt, be), w.p.now(), 0, 0)
	w.p.log.V(1).Info("Warming a cold replica from its peers", "model", model, "replica", be.Key, "states", len(plan))
	if len(plan) == 0 {
		w.skipped.WithLabelValues(be.Node, nothingToWarm).Inc()
		return
	}
	for start := 0; start < len(plan) && ctx.Err() == nil; start += warmBatch {
		batch := plan[start:min(start+warmBatch, len(plan))]
		var req runnerapi.PeerWarmRequest
		for _, c := range batch {
			h, err := w.p.signHint(ctx, peers[c.Source], be, c.Digest, c.Partition, c.Inputs.Tokens)
			if err != nil {
				w.p.log.Error(err, "Signing a state ticket; the replica is not warmed", "model", model)
				return
			}
			w.p.sent(be, c.Partition, c.Digest)
			req.Hints = append(req.Hints, h)
		}
		resp, err := w.post(ctx, be, req)
		if err != nil {
			w.p.log.Info("Asking a cold replica's agent to warm up failed", "model", model, "replica", be.Key, "err", err.Error())
			return
		}
		for i, res := range resp.Results[:min(len(resp.Results), len(batch))] {
			w.warmups.WithLabelValues(model, w.p.count(model, peers[batch[i].Source], be, res)).Inc()
		}
	}
}

// candidates are the states replicas of rt on other Macs than be's hold of the
// conversations routed lately to be's Mac itself (peerfetch.Recent.SentTo: a Mac is
// warmed only with prompts it was already sent, never with the other conversations of
// a partition it served once), beyond what be holds of them: per conversation and
// replica, the deepest digest it holds of those it was sent (peerHit), with when the
// conversation was last routed to be's Mac.
func (w *warmer) candidates(rt *Route, be Backend) []peerfetch.Candidate {
	model := rt.ID()
	var out []peerfetch.Candidate
	for _, c := range w.recent.SentTo(model, be.Node) {
		own := w.p.index.Deepest(be.Key, c.Digests)
		for _, o := range rt.Backends {
			if o.Node == "" || o.Node == be.Node || o.Key == be.Key || !w.p.reaches(o, be) {
				continue
			}
			hit := w.p.peerHit(o, c.Partition, c.Digests)
			if hit.Depth <= own.Depth {
				continue
			}
			tokens := hit.Tokens - own.Tokens
			out = append(out, peerfetch.Candidate{Digest: c.Digests[hit.Depth-1], Partition: c.Partition, Source: o.Key, LastHit: c.At,
				TargetServed: c.SentAt,
				Inputs:       w.p.est.Inputs(model, peerfetch.LinkKey{Source: o.Node, Target: be.Node}, tokens, w.p.margin, w.p.prior(o, be))})
		}
	}
	return out
}

// postWarm asks be's agent to warm up: POST /api/models/{id}/states/warm.
func (g *Gateway) postWarm(ctx context.Context, be Backend, wr runnerapi.PeerWarmRequest) (runnerapi.PeerWarmResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, (runnerapi.WarmTimeoutSeconds+10)*time.Second)
	defer cancel()
	body, err := json.Marshal(wr)
	if err != nil {
		return runnerapi.PeerWarmResponse{}, err
	}
	u := g.agentScheme + be.Endpoint + "/api/models/" + url.PathEscape(be.Key) + "/states/warm"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return runnerapi.PeerWarmResponse{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req = g.toAgent(req, prefixindex.Target{Key: be.Key, Endpoint: be.Endpoint, Node: be.Node})
	resp, err := g.transport.RoundTrip(req)
	if err != nil {
		return runnerapi.PeerWarmResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return runnerapi.PeerWarmResponse{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return runnerapi.PeerWarmResponse{}, fmt.Errorf("the agent answered %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var out runnerapi.PeerWarmResponse
	if err := json.Unmarshal(b, &out); err != nil {
		return runnerapi.PeerWarmResponse{}, fmt.Errorf("reading the agent's warm-up answer: %w", err)
	}
	return out, nil
}

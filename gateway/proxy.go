package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	runnerapi "github.com/macfleet/macfleet/api/runnerapi"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/prefixdigest"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/gateway/splice"
	"github.com/macfleet/macfleet/gateway/usagemeter"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/tracing"
)

// Waiting for a replica after every routable one failed: the pause before trying
// them again doubles from minBackoff to maxBackoff (a table change wakes the request
// sooner). A cold start that ends in a 503 tells the client to retry after
// coldRetryAfter.
const (
	minBackoff     = 100 * time.Millisecond
	maxBackoff     = 2 * time.Second
	coldRetryAfter = 5 * time.Second
	// failureBodyLimit bounds what is kept of a 503/507 body for passing it through.
	failureBodyLimit = 64 << 10
)

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// outcome is how one attempt ended.
type outcome struct {
	status int
	// reason labels errors_total; "" for a success.
	reason string
	// failure is set when the attempt may be retried: nothing was written.
	failure *failure
	// abort: the response broke after its status was sent and the connection must be
	// cut so the client sees a failure.
	abort bool
	// usage is what the answer is counted as using: the replica's report, cut to the
	// request's bound (nil: nothing reported, or nothing readable).
	usage *metering.Usage
	// broken is set when a stream that may be continued broke after its first byte;
	// nothing was written of the break yet (continuation.go).
	broken *brokenStream
}

// brokenStream is a stream's break: how, what the client has of it, and the replica
// that failed.
type brokenStream struct {
	brk     *splice.Break
	st      *splice.Stream
	backend Backend
}

// handleProxy serves POST /v1/...: resolve the model, then try replicas until one
// answers (or the request's patience runs out).
func (g *Gateway) handleProxy(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	r, span := tracing.StartServer(g.tracer, r, "")
	model, res := g.proxy(w, r, start)
	endRequest(span, model, res)
	g.accessLog(r, model, res, start)
	if res.abort {
		panic(http.ErrAbortHandler)
	}
}

// proxy is handleProxy's work: it returns the deployment ("" before it is known) and
// how the request ended, once counted.
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request, start time.Time) (string, outcome) {
	endpoint := endpointLabel(r.URL.Path)
	body, aerr := readBody(w, r, g.opts.MaxBodyBytes)
	if aerr != nil {
		return "", g.fail(w, "", endpoint, aerr)
	}
	prefixBytes := 0
	if g.opts.Routing != RoutingLeastLoad {
		prefixBytes = g.opts.PrefixBytes
	}
	head, aerr := parseHead(body, prefixBytes)
	if aerr != nil {
		return "", g.fail(w, "", endpoint, aerr)
	}
	id := g.caller(r)
	tagCaller(r.Context(), id)
	rt, aerr := resolve(g.Table(), head.Model, id)
	if aerr != nil {
		return "", g.fail(w, "", endpoint, aerr)
	}
	model := rt.ID()
	gauge := g.metrics.inflight.WithLabelValues(model)
	gauge.Inc()
	defer gauge.Dec()
	defer g.traffic.started(model)()
	var h uint64
	if g.opts.Routing == RoutingPrefixAffinity || head.keyed {
		h = routing.HashKey(head.prefix)
	}
	flow, prio, err := admission.Classify(r, id, g.opts.Identify != nil, clientKey(r))
	if err != nil {
		return model, g.fail(w, model, endpoint, invalidRequest(openaierr.CodeInvalidValue, "", "bad_request", "%v", err))
	}
	lim := usageLimits(endpoint, head, body)
	if g.opts.Budgets != nil {
		var done func()
		done, body, lim, aerr = g.reserve(r.Context(), w, id, rt, budgetAsk{endpoint: endpoint, caps: head.caps, lim: lim, body: body})
		if aerr != nil {
			return model, g.fail(w, model, endpoint, aerr)
		}
		if done != nil {
			defer done()
		}
	}
	hint := routing.Hint{Mode: g.opts.Routing, H: h}
	if g.opts.Routing == RoutingPrefixCache && rt.PromptCache {
		hint.Keyed = head.keyed
		var all []string
		if c, ok := prefixdigest.Parse(body); ok {
			all = c.DigestsWith(g.opts.PrefixDigestKey, id.CachePartition(), model)
			hint.Digests = c.Routable(all)
		}
		r = r.WithContext(withPrefixDigests(r.Context(), all, hint.Digests))
	}
	t := g.adm.NewTicket(admission.Request{Model: model, Flow: flow, Priority: prio, Hint: hint, Width: head.N})
	w, endHold := g.holdStream(w, r, head)
	defer endHold()
	res := g.serve(&proxied{w: w, r: r, body: body, name: head.Model, id: id, t: t, lim: lim, start: start})
	g.count(model, endpoint, res.status, res.reason)
	return model, res
}

func (g *Gateway) fail(w http.ResponseWriter, model, endpoint string, e *apiError) outcome {
	g.count(model, endpoint, e.Status, e.reason)
	e.write(w)
	return outcome{status: e.Status, reason: e.reason}
}

// serve tries replicas of the model's deployment, each one that admission gives it:
// at once when one has room, else when its turn in the deployment's fair queue comes.
// A failed attempt (connect error, 503, 507, or a 404 from an agent that no longer has
// the replica) excludes its replica and tries another; when every replica is excluded
// it waits for the table to change or a backoff to pass (then every replica may be
// tried again), until ColdStartTimeout after the request arrived.
func (g *Gateway) serve(p *proxied) (res outcome) {
	ctx, w, t, model := p.r.Context(), p.w, p.t, p.t.Request().Model
	defer g.adm.Leave(t)
	wt := waiting{g: g, model: model, start: p.start, backoff: minBackoff}
	defer func() { wt.end(res.reason) }()
	attempts := 0
	for {
		tbl := g.Table()
		rt, aerr := resolve(tbl, p.name, p.id)
		if aerr != nil { // the deployment went away while the request waited
			aerr.write(w)
			return outcome{status: aerr.Status, reason: aerr.reason}
		}
		// An autoscaled deployment with no routable replica is woken: its autoscaler
		// brings one, even from zero.
		wakeable := len(rt.Backends) == 0 && rt.Autoscaled && g.waker != nil
		if len(rt.Backends) == 0 && rt.Unavailable != "" && !(wakeable && rt.ScaledToZero) {
			e := &apiError{Status: http.StatusServiceUnavailable, Type: openaierr.TypeUnavailable, Code: codeNoReplica,
				Message: rt.Unavailable, RetryAfter: coldRetryAfter, reason: "no_ready_replica"}
			e.write(w)
			wt.observe()
			return outcome{status: e.Status, reason: e.reason}
		}
		be, ok, full := g.adm.Acquire(rt, t)
		if full != nil {
			e := queueFull(full)
			e.write(w)
			return outcome{status: e.Status, reason: e.reason}
		}
		if !ok {
			var next waitNext
			if be, res, next = wt.wait(ctx, w, tbl, rt, t, wakeable); next == waitDone {
				return res
			} else if next == waitAgain {
				continue
			}
		}
		wt.granted()
		g.routed(ctx, t)
		attempts++
		res := g.attempt(ctx, p, try{rt: rt, be: be, body: p.body, n: attempts, st: g.spliceFor(p.r)})
		g.adm.Release(t, be.Key)
		if res.failure == nil {
			if res.broken != nil {
				g.adm.Exclude(t, be.Key)
				res = g.continueStream(ctx, p, attempts, res)
			}
			wt.observe()
			return res
		}
		wt.last = res.failure
		g.adm.Exclude(t, be.Key)
		wt.waitable = wt.waitable || !wt.last.final()
		g.metrics.retries.WithLabelValues(model, wt.last.reason).Inc()
		g.log.V(1).Info("Attempt failed before the first byte; trying another replica", "model", model,
			"replica", be.Key, "endpoint", be.Endpoint, "reason", wt.last.reason, "failure", wt.last)
	}
}

func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}

// holdTimeout is the 503 of a request that found no replica to serve it in time: none
// was routable, or every one stayed busy with the requests before it.
func (g *Gateway) holdTimeout(rt *Route, last *failure, t *admission.Ticket) *apiError {
	if len(rt.Backends) > 0 && last == nil {
		req := t.Request()
		n, retry := g.adm.Waiting(req.Model)
		g.metrics.queueRejected.WithLabelValues(req.Model, req.Priority.String(), "queue_timeout").Inc()
		return &apiError{Status: http.StatusServiceUnavailable, Type: openaierr.TypeUnavailable, Code: codeQueueTimeout,
			Message: fmt.Sprintf("every replica of deployment %s stayed busy for %v; %d requests still wait for it "+
				"(raise spec.replicas or spec.autoscaling.maxReplicas, or send fewer requests at once)",
				rt.ID(), g.opts.ColdStartTimeout, n),
			RetryAfter: retry, reason: "queue_timeout"}
	}
	msg := fmt.Sprintf("no replica of deployment %s became ready within %v", rt.ID(), g.opts.ColdStartTimeout)
	switch {
	case last != nil:
		msg += fmt.Sprintf(" (last attempt: %s)", last)
	case rt.Replicas == 0 && rt.Autoscaled && g.waker != nil:
		msg += " (the autoscaler was asked for one; see the deployment's Autoscaling condition)"
	case rt.Replicas == 0:
		msg += " (no replica exists yet)"
	default:
		msg += fmt.Sprintf(" (%d replicas exist, none is Ready on a Ready Mac)", rt.Replicas)
	}
	return &apiError{Status: http.StatusServiceUnavailable, Type: openaierr.TypeUnavailable, Code: codeNoReplica,
		Message: msg, RetryAfter: coldRetryAfter, reason: "no_ready_replica"}
}

// try is one attempt of a request: the replica it goes to and the route it was
// resolved from, the body it sends (the client's, or a continuation's), its number
// among the request's attempts, and the record of the stream it reads (nil: one not
// spliced; see spliceFor).
type try struct {
	rt   *Route
	be   Backend
	body []byte
	n    int
	st   *splice.Stream
}

// attempt sends the request to one replica. Before the response's status is committed
// to the client it can fail retryably; after that it streams the body through,
// flushing every chunk, until the upstream ends or either side goes away. With st, a
// Chat Completions stream is read event by event so that it can be continued on
// another replica if this one fails; once st has broken, the attempt is such a
// continuation, spliced into the stream the client already has.
func (g *Gateway) attempt(ctx context.Context, p *proxied, tr try) (res outcome) {
	w, r, rt, be, st, model := p.w, p.r, tr.rt, tr.be, tr.st, tr.rt.ID()
	cont := st != nil && st.Broken()
	// The upstream request outlives a client that goes away just long enough for its
	// answer to end with its usage (see cancel.go).
	id := newRequestID()
	var cancelled cancellation
	up, stop := g.detach(ctx, be, model, id, &cancelled)
	defer stop()
	up, cut := context.WithCancelCause(up)
	defer cut(nil)
	out, err := http.NewRequestWithContext(pki.WithNode(up, be.Node), r.Method, g.agentScheme+be.Endpoint+r.URL.RequestURI(), bytes.NewReader(tr.body))
	if err != nil {
		return outcome{failure: &failure{backend: be, reason: "transport", err: err}}
	}
	copyRequestHeaders(out.Header, r)
	out.Header.Set(runnerapi.HeaderRequestID, id)
	span := g.startAttempt(ctx, out, be, tr.n)
	defer func() { endAttempt(span, res) }()
	g.setUpstreamHeaders(out, r, model, be)
	if st != nil {
		st.SetUpstreamHeaders(out.Header)
	}
	var peer *peerSource
	if g.peers != nil {
		ask := prefixAsk{digests: prefixDigestsFrom(ctx).routable, partition: g.caller(r).CachePartition()}
		if cont {
			ask.broken = st.BrokeOn()
		}
		peer = g.peers.hint(out, rt, model, be, ask)
		g.warm.record(model, ask.digests, ask.partition, be.Node)
	}
	// A Mac lost before its answer's headers (its agent stopped or frozen after it
	// accepted the connection) cuts the request, which fails retryably; after them,
	// only a stream being spliced stays watched (it is continued elsewhere).
	unwatch := g.watchMac(be.Node, cut)
	defer unwatch()
	sent := time.Now()
	resp, err := g.transport.RoundTrip(out)
	if err != nil {
		if ctx.Err() != nil {
			g.lostOnCancel(p, model, be, &cancelled, nil)
			return outcome{status: openaierr.StatusClientGone, reason: "client_gone"}
		}
		reason := "transport"
		if opErr, ok := errors.AsType[*net.OpError](err); ok && opErr.Op == "dial" {
			reason = "connect"
		}
		return outcome{failure: &failure{backend: be, reason: reason, err: err}}
	}
	defer resp.Body.Close()
	if ctx.Err() != nil && resp.StatusCode != http.StatusOK {
		// The client went away and no answer follows that a runner generated.
		return outcome{status: openaierr.StatusClientGone, reason: "client_gone"}
	}
	if peer != nil {
		g.peers.report(model, be, peer, resp.Header)
	}
	if res, done := commit(w, resp, be, cont); done {
		return res
	}
	if st != nil && resp.StatusCode == http.StatusOK && isEventStream(resp.Header) {
		resp.Body = splice.NewReader(resp.Body, st, cont)
	} else {
		unwatch()
	}
	a := relayed{model: model, be: be, span: span, cancelled: &cancelled, continuing: cont}
	res = g.relay(ctx, p, resp, &a)
	if g.peers != nil && peer == nil && isEventStream(resp.Header) && !a.firstAt.IsZero() {
		g.peers.observePrefill(model, res.usage, a.firstAt.Sub(sent))
	}
	return res
}

// setUpstreamHeaders sets the headers the agent reads: the fleet token, the replica,
// the deployment's queue, the gateway and the caller's cache partition.
func (g *Gateway) setUpstreamHeaders(out, r *http.Request, model string, be Backend) {
	if tok := g.opts.FleetToken(); tok != "" {
		out.Header.Set("Authorization", "Bearer "+tok)
	}
	out.Header.Set(mfv1.HeaderReplica, be.Key)
	queued, area := g.adm.Queued(model)
	out.Header.Set(mfv1.HeaderQueued, strconv.Itoa(queued))
	if area == 0 { // the common case, without formatting a float
		out.Header.Set(mfv1.HeaderQueuedSeconds, "0")
	} else {
		out.Header.Set(mfv1.HeaderQueuedSeconds, strconv.FormatFloat(area, 'f', 6, 64))
	}
	out.Header.Set(mfv1.HeaderGateway, g.id)
	if p := g.caller(r).CachePartition(); p != "" {
		out.Header.Set(runnerapi.HeaderCachePartition, p)
	}
	if d := prefixDigestsFrom(r.Context()).all; len(d) > 0 {
		out.Header.Set(runnerapi.HeaderPrefixDigests, strings.Join(d, ","))
	}
}

// commit sends the response's status and headers to the client, unless it ends the
// attempt first (see uncommitted). A continuation's are not sent (the client has the
// stream's), and any answer but a stream fails it.
func commit(w http.ResponseWriter, resp *http.Response, be Backend, cont bool) (outcome, bool) {
	if !cont {
		if res, done := uncommitted(w, resp, be); done {
			return res, true
		}
		copyResponseHeaders(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		return outcome{}, false
	}
	if resp.StatusCode == http.StatusOK && isEventStream(resp.Header) {
		return outcome{}, false
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, failureBodyLimit))
	return outcome{failure: &failure{backend: be, reason: fmt.Sprintf("status_%d", resp.StatusCode),
		status: resp.StatusCode, header: resp.Header.Clone(), body: b}}, true
}

// uncommitted handles the statuses that end the attempt before any byte reaches the
// client: a 503 or 507 fails it retryably, and so does a 404 of a replica the agent no
// longer has; another 404 is passed through. done: resp was handled.
func uncommitted(w http.ResponseWriter, resp *http.Response, be Backend) (res outcome, done bool) {
	if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusInsufficientStorage {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, failureBodyLimit))
		return outcome{failure: &failure{backend: be, reason: fmt.Sprintf("status_%d", resp.StatusCode),
			status: resp.StatusCode, header: resp.Header.Clone(), body: b}}, true
	}
	if resp.StatusCode != http.StatusNotFound {
		return outcome{}, false
	}
	// The table named this replica, so an agent that does not know it has just
	// removed it (a rolling update or scale-down deleted it before the table
	// caught up): another replica can serve the request.
	b, _ := io.ReadAll(io.LimitReader(resp.Body, failureBodyLimit))
	if bytes.Contains(b, []byte(`"model_not_found"`)) {
		return outcome{failure: &failure{backend: be, reason: "replica_gone",
			status: resp.StatusCode, header: resp.Header.Clone(), body: b}}, true
	}
	copyResponseHeaders(w.Header(), resp.Header)
	w.Header().Del("Content-Length")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(b)
	return outcome{status: resp.StatusCode, reason: "upstream_status"}, true
}

// relayed is what relay needs of its attempt beside the request and the response: the
// deployment and the replica that answers.
type relayed struct {
	model     string
	be        Backend
	span      trace.Span
	cancelled *cancellation
	// firstAt is set by relay: when the answer's first byte came (zero: none did).
	firstAt time.Time
	// continuing: the answer continues a stream the client has (its first byte was
	// another replica's).
	continuing bool
}

// relay streams the committed response resp of replica a.be to the client, flushing
// every chunk, until the upstream ends or either side goes away. The usage the replica
// reports is bounded by the request's (see meter).
func (g *Gateway) relay(ctx context.Context, p *proxied, resp *http.Response, a *relayed) outcome {
	w, r, model, be := p.w, p.r, a.model, a.be
	res := outcome{status: resp.StatusCode}
	if resp.StatusCode >= 400 {
		res.reason = "upstream_status"
	}
	rc := http.NewResponseController(w)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	first := resp.StatusCode < 400 && !a.continuing
	var sent delivery
	// gone: the client went away; the rest of the answer is read, not sent, up to its
	// usage trailer (or until the cancellation gives up on it).
	gone := false
	for {
		n, rerr := resp.Body.Read(buf)
		gone = gone || ctx.Err() != nil
		if n > 0 && !gone {
			if first {
				a.firstAt = time.Now()
				ttft := a.firstAt.Sub(p.start)
				g.metrics.ttft.WithLabelValues(model, endpointLabel(r.URL.Path)).Observe(ttft.Seconds())
				g.traffic.firstByte(model, ttft)
				firstByte(a.span, ttft)
				first = false
			}
			// Whole before the client can read the end: one that closes at [DONE]
			// must find the cancellation whole (see detach).
			next := sent
			next.add(buf[:n])
			if next.complete(resp) {
				a.cancelled.whole.Store(true)
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				gone = true
			} else {
				_ = rc.Flush()
				sent = next
			}
		}
		if rerr == io.EOF {
			res.usage = g.meter.Trailer(usagemeter.Answer{Caller: g.caller(r), Model: model, Backend: be, Limits: p.lim}, resp)
			if gone && !sent.complete(resp) {
				g.metrics.cancellations.WithLabelValues(model, a.cancelled.outcome(true)).Inc()
				return outcome{status: openaierr.StatusClientGone, reason: "client_gone", usage: res.usage}
			}
			return res
		}
		if rerr != nil {
			if sent.complete(resp) {
				// The client has the whole answer (a stream's [DONE], or every byte
				// of a sized body): it was served, whether it hung up or the upstream
				// broke (its Mac lost) before the usage trailer came. Nothing more is
				// written; a stream is metered at the gateway's count of what it read.
				if sr, ok := resp.Body.(*splice.Reader); ok {
					res.usage = g.relayedUsage(p, be, sr.Stream())
				}
				return res
			}
			if gone || ctx.Err() != nil {
				u := g.lostOnCancel(p, model, be, a.cancelled, resp.Body)
				return outcome{status: openaierr.StatusClientGone, reason: "client_gone", usage: u}
			}
			return g.broken(w, rc, model, be, resp, rerr)
		}
	}
}

// broken ends a response that broke off after it started: not retried; a stream gets
// an error event, another body is aborted.
func (g *Gateway) broken(w http.ResponseWriter, rc *http.ResponseController, model string, be Backend, resp *http.Response, rerr error) outcome {
	if brk, ok := errors.AsType[*splice.Break](rerr); ok {
		if sr, ok := resp.Body.(*splice.Reader); ok { // the caller may continue it
			st := sr.Stream()
			st.Broke(be.Key)
			return outcome{status: resp.StatusCode, reason: "stream_broken", broken: &brokenStream{brk: brk, st: st, backend: be}}
		}
	}
	g.log.Info("Upstream response broke after it started; not retried", "model", model,
		"replica", be.Key, "endpoint", be.Endpoint, "err", rerr.Error())
	e := &apiError{Status: http.StatusBadGateway, Type: openaierr.TypeServer, Code: openaierr.CodeUpstream,
		Message: fmt.Sprintf("the response of replica %s broke off: %v", be.Key, rerr)}
	if isEventStream(resp.Header) {
		_, _ = w.Write(e.sseEvent())
		_ = rc.Flush()
		return outcome{status: resp.StatusCode, reason: "stream_broken"}
	}
	return outcome{status: resp.StatusCode, reason: "stream_broken", abort: true}
}

// doneEvent is the last event of an OpenAI stream.
const doneEvent = splice.DoneEvent

// delivery is what of a response reached the client: its size and its last bytes.
type delivery struct {
	bytes int64
	tail  [len(doneEvent)]byte
	full  int // bytes of tail in use
}

func (d *delivery) add(b []byte) {
	d.bytes += int64(len(b))
	if len(b) >= len(d.tail) {
		copy(d.tail[:], b[len(b)-len(d.tail):])
		d.full = len(d.tail)
		return
	}
	copy(d.tail[:], d.tail[len(b):])
	copy(d.tail[len(d.tail)-len(b):], b)
	d.full = min(d.full+len(b), len(d.tail))
}

// complete reports whether the client has the whole response: a body of known size
// fully sent, or an event stream that ended with [DONE].
func (d *delivery) complete(resp *http.Response) bool {
	if resp.ContentLength >= 0 {
		return d.bytes == resp.ContentLength
	}
	// The tail first: relay asks after every chunk, and the type is parsed.
	return d.full == len(d.tail) && string(d.tail[:]) == doneEvent && isEventStream(resp.Header)
}

func isEventStream(h http.Header) bool {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return mt == "text/event-stream"
}

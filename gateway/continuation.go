package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/splice"
	"github.com/macfleet/macfleet/gateway/usagemeter"
	"github.com/macfleet/macfleet/internal/openaierr"
)

// Continuing a broken stream (docs/fleet.md, "Continuing a broken stream"): a
// Chat Completions stream whose replica fails after the first byte is sent again to
// another replica, with what the client already has as the assistant's open message
// (runnerapi.HeaderContinue), and that replica's deltas are spliced into the client's
// stream (package splice).
const (
	// DefaultStreamContinuations is how many times one stream may be continued.
	DefaultStreamContinuations = 1
	// DefaultContinueTimeout bounds how long a broken stream waits for a replica to
	// take its continuation.
	DefaultContinueTimeout = 15 * time.Second
	// HeaderContinued is the trailer of a stream that was continued: how many times.
	HeaderContinued = "X-Macfleet-Continued"
)

// continuation is a broken stream's case (splice.Continuation) and the replica it
// last broke on.
type continuation struct {
	*splice.Continuation
	failed Backend
}

// spliceFor is the record of a request's stream: a Chat Completions, Responses or
// Messages request's (nil otherwise), which the gateway reads, counts and may continue
// (with continuations off, splice.Continuation.Decide says so).
func (g *Gateway) spliceFor(r *http.Request) *splice.Stream {
	api, ok := splice.APIOf(r.URL.Path)
	if !ok {
		return nil
	}
	return splice.New(api)
}

// continueStream continues the stream that res broke off on another replica, as long
// as its case's Decide allows; the client gets the held error when it does not. n is
// the request's attempts so far.
func (g *Gateway) continueStream(ctx context.Context, p *proxied, n int, res outcome) outcome {
	model := p.t.Request().Model
	c := continuation{failed: res.broken.backend, Continuation: splice.NewContinuation(res.broken.brk, res.broken.st, p.body,
		g.opts.StreamContinuations, time.Now().Add(g.opts.ContinueTimeout))}
	span := trace.SpanFromContext(ctx)
	backoff := minBackoff // across tries: a replica that keeps failing is tried less and less often
	for {
		ok, why := c.Decide(time.Now())
		if ok && ctx.Err() == nil {
			c.Take()
			var rt *Route
			var be Backend
			if rt, be, ok = g.continuationReplica(ctx, p, c.Deadline(), &backoff); !ok {
				why = splice.Deadline
			} else {
				from := c.Sent()
				n++
				res = g.continueOn(ctx, p, try{rt: rt, be: be, n: n}, c)
				if res.broken == nil && res.failure == nil {
					if res.status == http.StatusOK && ctx.Err() == nil && c.NextChoice(time.Now().Add(g.opts.ContinueTimeout)) {
						continue // the next choice of several: its own continuation, within this break's
					}
					if res.status == http.StatusOK && ctx.Err() == nil {
						g.continuedOK(p, span, be, c, from)
					}
					return res
				}
				if res.broken != nil {
					c.failed = res.broken.backend
					c.Broke(res.broken.brk)
				}
				if f := res.failure; f != nil && f.status == http.StatusBadRequest {
					c.Refused(f.body)
				}
				continue
			}
		}
		if ctx.Err() != nil {
			return outcome{status: openaierr.StatusClientGone, reason: "client_gone"}
		}
		g.metrics.continuations.WithLabelValues(model, why).Inc()
		span.AddEvent("stream_not_continued", trace.WithAttributes(attribute.String("macfleet.reason", why)))
		if c.Stream().API() == splice.Chat && (why == splice.ToolCall || why == splice.Finished) {
			return g.endCleanly(p, c, why)
		}
		return g.endBroken(p, c, why)
	}
}

// continuedOK records a stream whose continuation on replica to ended it: its trailer,
// metric and span event (from: the bytes of the continued choice's text the client had
// before).
func (g *Gateway) continuedOK(p *proxied, span trace.Span, to Backend, c continuation, from int) {
	p.w.Header().Set(http.TrailerPrefix+HeaderContinued, strconv.Itoa(c.Stream().Continued()))
	g.metrics.continuations.WithLabelValues(p.t.Request().Model, splice.Continued).Inc()
	span.AddEvent("stream_continued", trace.WithAttributes(attribute.String("macfleet.from", c.failed.Key),
		attribute.String("macfleet.to", to.Key), attribute.Int("macfleet.continued_bytes", from)))
}

// continueOn sends the continuation c as attempt tr (its replica and number; the
// body and stream are c's); a failure before its first byte excludes the replica for
// the next try.
func (g *Gateway) continueOn(ctx context.Context, p *proxied, tr try, c continuation) outcome {
	be := tr.be
	cbody, err := c.Body(p.body)
	if err != nil { // the replica took the body, so this does not happen
		return outcome{failure: &failure{backend: be, reason: "transport", err: err}}
	}
	g.log.Info("Continuing a broken stream on another replica", "model", p.t.Request().Model, "replica", be.Key,
		"cause", c.Break().Cause(), "err", c.Break().Error(), "choice", c.Choice(), "sentBytes", c.Sent())
	tr.body, tr.st = cbody, c.Stream()
	res := g.attempt(ctx, p, tr)
	g.adm.Release(p.t, be.Key)
	if res.failure != nil || res.broken != nil {
		g.adm.Exclude(p.t, be.Key)
	}
	return res
}

// endBroken ends request p's stream that is not continued with the replica's error
// event (the gateway's for a connection that broke), saying why it was not continued.
// No replica reported its usage, so the gateway meters its own count of what it
// relayed (brokenUsage).
func (g *Gateway) endBroken(p *proxied, c continuation, why string) outcome {
	w, model := p.w, p.t.Request().Model
	be, brk, st := c.failed, c.Break(), c.Stream()
	g.log.Info("Upstream stream broke after it started; not continued", "model", model,
		"replica", be.Key, "endpoint", be.Endpoint, "err", brk.Error(), "why", why)
	metered := g.relayedUsage(p, be, st)
	e := &apiError{Status: http.StatusBadGateway, Type: openaierr.TypeServer, Code: openaierr.CodeUpstream,
		Message: fmt.Sprintf("the response of replica %s broke off: %v", be.Key, brk)}
	if st.API() == splice.Responses || st.API() == splice.Messages {
		if reason := c.Reason(why); reason != "" {
			e.Message += "; not continued on another replica: " + reason
		}
		_, _ = w.Write(st.BrokenEvent(e.Message))
		_ = http.NewResponseController(w).Flush()
		return outcome{status: http.StatusOK, reason: "stream_broken", usage: metered}
	}
	var held struct{ Error *apiError }
	if brk.Cause() == "error_event" && json.Unmarshal(st.HeldError(), &held) == nil && held.Error != nil {
		e = held.Error
	}
	if reason := c.Reason(why); reason != "" {
		e.Message += "; not continued on another replica: " + reason
	}
	_, _ = w.Write(e.sseEvent())
	_ = http.NewResponseController(w).Flush()
	return outcome{status: http.StatusOK, reason: "stream_broken", usage: metered}
}

// relayedUsage meters request p's stream st, which ended without a usage report from
// its last replica be, at the gateway's own count of what it relayed (every choice's
// tokens, from every replica; splice.Stream.RelayedUsage), within the request's bound
// as a report is; nil when the runner sent no count.
func (g *Gateway) relayedUsage(p *proxied, be Backend, st *splice.Stream) *metering.Usage {
	u, ok := st.RelayedUsage()
	if !ok {
		return nil
	}
	g.metrics.usageRelayed.WithLabelValues(p.t.Request().Model).Inc()
	return g.meter.Claim(usagemeter.Answer{Caller: g.caller(p.r), Model: p.t.Request().Model, Backend: be, Limits: p.lim}, u, nil)
}

// endCleanly ends request p's Chat Completions stream that broke after a tool call or
// its finish_reason (see splice.Continuation.CleanEnd): the replica that broke reports
// no usage, so the gateway meters its own count (within the request's bound, as a
// report is), and sends it as the usage chunk when the client asked for one.
func (g *Gateway) endCleanly(p *proxied, c continuation, why string) outcome {
	model, be := p.t.Request().Model, c.failed
	g.log.Info("Upstream stream broke after a tool call or its finish; ended cleanly", "model", model,
		"replica", be.Key, "endpoint", be.Endpoint, "err", c.Break().Error(), "why", why)
	var metered *metering.Usage
	if u, ok := c.CountedUsage(); ok {
		metered = g.meter.Claim(usagemeter.Answer{Caller: g.caller(p.r), Model: model, Backend: be, Limits: p.lim}, u, nil)
	}
	_, _ = p.w.Write(c.CleanEnd(metered))
	_ = http.NewResponseController(p.w).Flush()
	return outcome{status: http.StatusOK, reason: "stream_broken", usage: metered}
}

// continuationReplica waits until deadline for a replica of request p's deployment to
// take a continuation: admission picks it as for any request (a replica that holds the
// conversation's prefix first), the failed ones excluded until backoff has passed
// (then tried again, and backoff doubles: it is the stream's, across its tries).
func (g *Gateway) continuationReplica(ctx context.Context, p *proxied, deadline time.Time, backoff *time.Duration) (*Route, Backend, bool) {
	t := p.t
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		tbl := g.Table()
		rt, aerr := resolve(tbl, p.name, p.id)
		if aerr != nil {
			return nil, Backend{}, false
		}
		be, ok, full := g.adm.Acquire(rt, t)
		if full != nil {
			return nil, Backend{}, false
		}
		if ok {
			g.routed(ctx, t)
			return rt, be, true
		}
		bt := time.NewTimer(*backoff)
		select {
		case be := <-t.Granted():
			bt.Stop()
			g.routed(ctx, t)
			return rt, be, true
		case <-ctx.Done():
		case <-timer.C:
		case <-tbl.Changed():
			bt.Stop()
			continue
		case <-bt.C:
			g.adm.Forgive(rt, t)
			*backoff = min(*backoff*2, maxBackoff)
			continue
		}
		bt.Stop()
		return nil, Backend{}, false
	}
}

package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/splice"
	"github.com/macfleet/macfleet/internal/pki"
)

// Cancelling an answer whose client went away, without losing its usage.
//
// Every attempt names its request to the agent (runnerapi.HeaderRequestID, random)
// and runs under a context detached from the client's. When the client goes away,
// the gateway asks the agent to cancel that request (POST /api/requests/cancel); the
// agent asks the request's runner to end it, and the runner ends it as at a stop
// condition: the answer ends at once with the usage of what was generated, which the
// agent sends as its usage trailer and the gateway counts. The gateway reads the
// rest of the answer, sending nothing on, for at most CancelGrace; then it drops the
// connection as it did before and meters a stream at its own count of the tokens it
// read (logged and counted in macfleet_gateway_cancellations_total and
// macfleet_gateway_usage_relayed_total). A request that no runner was generating yet
// (queued on the agent) is dropped at once: nothing was generated.

// DefaultCancelGrace bounds how long the gateway waits for a cancelled answer's end.
const DefaultCancelGrace = 2 * time.Second

// pathCancel is the agent's endpoint that cancels a named request.
const pathCancel = "/api/requests/cancel"

// Outcomes of a cancellation (macfleet_gateway_cancellations_total's outcome label).
const (
	cancelMetered    = "metered"     // the answer ended with its usage, counted
	cancelNotRunning = "not_running" // no runner had the request yet: dropped, nothing generated
	cancelTimedOut   = "timed_out"   // the answer did not end within CancelGrace: dropped, metered at the gateway's count of a stream
	cancelFailed     = "failed"      // the agent could not be asked: dropped, metered at the gateway's count of a stream
)

// cancellation is one attempt's cancellation, shared by the goroutine that asks the
// agent and the one that reads the answer.
type cancellation struct {
	state atomic.Int32 // one of the cancel* states below
	// whole: the client has the whole answer (a stream's [DONE]); one that goes away
	// then (the official clients close the body at [DONE]) is not cancelled, and the
	// answer is read to its usage trailer, for at most CancelGrace.
	whole atomic.Bool
}

const (
	cancelNone int32 = iota
	cancelAsked
	cancelFound
	cancelMissing
	cancelError
)

// newRequestID is a random request id: 128 bits, unguessable, so a request can be
// cancelled only by who sent it.
func newRequestID() string { return rand.Text() }

// detach returns the context of an attempt's upstream request: ctx's values without
// its cancellation, and the function that cancels it. When ctx ends (the client went
// away) before stop is called, the gateway asks the agent of be to end request id
// gracefully and cancels the upstream request if the agent does not have it, cannot
// be asked, or the answer has not ended within CancelGrace. A client that goes away
// with the whole answer (c.whole) leaves it to end by itself within CancelGrace, so
// that its usage trailer is read.
func (g *Gateway) detach(ctx context.Context, be Backend, model, id string, c *cancellation) (up context.Context, stop func()) {
	up, drop := context.WithCancel(context.WithoutCancel(ctx))
	stopAfter := context.AfterFunc(ctx, func() {
		if c.whole.Load() {
			time.AfterFunc(g.opts.CancelGrace, drop)
			return
		}
		c.state.Store(cancelAsked)
		actx, cancel := context.WithTimeout(up, g.opts.CancelGrace)
		defer cancel()
		found, err := g.askCancel(actx, be, id)
		switch {
		case err != nil && up.Err() != nil:
			// The attempt ended meanwhile: nothing to cancel.
		case err != nil:
			c.state.Store(cancelError)
			g.log.Info("Asking an agent to cancel a request failed; dropping it, metered at the gateway's count", "model", model,
				"replica", be.Key, "err", err.Error())
			drop()
		case !found && c.whole.Load():
			// The runner finished it meanwhile and the client had all of it: its
			// usage trailer follows.
			time.AfterFunc(g.opts.CancelGrace, drop)
		case !found:
			c.state.Store(cancelMissing)
			drop()
		default:
			c.state.Store(cancelFound)
			time.AfterFunc(g.opts.CancelGrace, drop)
		}
	})
	return up, func() {
		stopAfter()
		drop()
	}
}

// askCancel asks the agent of be to end request id; found: a runner was generating
// it and ends it now with its usage.
func (g *Gateway) askCancel(ctx context.Context, be Backend, id string) (bool, error) {
	b, _ := json.Marshal(runnerapi.Cancel{ID: id})
	req, err := http.NewRequestWithContext(pki.WithNode(ctx, be.Node), http.MethodPost, g.agentScheme+be.Endpoint+pathCancel, bytes.NewReader(b))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	if tok := g.opts.FleetToken; tok != nil && tok() != "" {
		req.Header.Set("Authorization", "Bearer "+tok())
	}
	resp, err := g.transport.RoundTrip(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, failureBodyLimit))
	if err != nil {
		return false, err
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("%s answered %d: %s", pathCancel, resp.StatusCode, bytes.TrimSpace(rb))
	}
	var out runnerapi.Cancelled
	if err := json.Unmarshal(rb, &out); err != nil {
		return false, fmt.Errorf("%s answered %q: %w", pathCancel, rb, err)
	}
	return out.Found, nil
}

// cancelOutcome is how the cancellation of an answer whose client went away ended,
// once its reading stopped: ended says the answer reached its end (and its usage
// trailer, counted).
func (c *cancellation) outcome(ended bool) string {
	if ended {
		return cancelMetered
	}
	switch c.state.Load() {
	case cancelMissing:
		return cancelNotRunning
	case cancelFound:
		return cancelTimedOut
	}
	return cancelFailed
}

// lostOnCancel counts (and, when a runner had generated part of it, logs) an answer
// whose client went away and that the gateway dropped before its end. A stream the
// gateway read (body, a splice reader) is metered at its own count of it
// (relayedUsage): the tokens the runner generated up to the drop, which no report
// will bring.
func (g *Gateway) lostOnCancel(p *proxied, model string, be Backend, c *cancellation, body io.Reader) *metering.Usage {
	o := c.outcome(false)
	g.metrics.cancellations.WithLabelValues(model, o).Inc()
	var metered *metering.Usage
	if sr, ok := body.(*splice.Reader); ok {
		metered = g.relayedUsage(p, be, sr.Stream())
	}
	if o != cancelNotRunning {
		g.log.Info("An answer whose client went away was dropped before its end; metered at the gateway's count",
			"model", model, "replica", be.Key, "outcome", o, "grace", g.opts.CancelGrace, "metered", metered != nil)
	}
	return metered
}

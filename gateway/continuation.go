package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/internal/openaierr"
)

// Continuing a broken stream (docs/fleet.md, "Continuing a broken stream"): a
// Chat Completions stream whose replica fails after the first byte is sent again to
// another replica, with what the client already has as the assistant's open message
// (runnerapi.HeaderContinue), and that replica's deltas are spliced into the client's
// stream (splice.go).
const (
	// DefaultStreamContinuations is how many times one stream may be continued.
	DefaultStreamContinuations = 1
	// DefaultContinueTimeout bounds how long a broken stream waits for a replica to
	// take its continuation.
	DefaultContinueTimeout = 15 * time.Second
	// HeaderContinued is the trailer of a stream that was continued: how many times.
	HeaderContinued = "X-Macfleet-Continued"
)

// Outcomes of a broken stream (stream_continuations_total): continued, or why not.
const (
	contContinued = "continued"
	contLimit     = "limit"       // it was continued as often as allowed
	contDeadline  = "deadline"    // no replica took it in time
	contFinished  = "finished"    // it had its finish_reason: nothing to continue
	contToolCall  = "tool_call"   // it broke in or after a tool call
	contReasoning = "reasoning"   // a Responses stream had reasoning its continuation cannot name
	contShape     = "unsupported" // a text completion, or n > 1 uncounted
	contRefused   = "refused"     // a replica refused the continuation itself (a 400)
	contDisabled  = "disabled"
)

// streamShape is what of a request decides whether its stream can be continued.
type streamShape struct {
	// n is its choices. (Output under a grammar, response_format, text.format or a
	// forced tool_choice, is continued: the continuing runner advances the grammar
	// past the text sent. A request that ends with an assistant's message, a Messages
	// request's own start of the answer, is continued: that message stays a closed
	// turn, as the first replica rendered it, before the open one.)
	n int
	// usage: a Chat Completions stream that asks for its usage chunk
	// (stream_options.include_usage), which a clean end writes (toolend.go).
	usage bool
}

// shapeOf reads the shape of a request body of api.
func shapeOf(api streamAPI, body []byte) streamShape {
	var req struct {
		N             *int `json:"n"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(body, &req)
	s := streamShape{n: 1}
	if api == chatAPI {
		if req.N != nil {
			s.n = *req.N
		}
		s.usage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	}
	return s
}

// continuation is one broken stream's case for a continuation.
type continuation struct {
	brk *streamBreak
	st  *spliced
	// failed is the replica the stream last broke on.
	failed Backend
	shape  streamShape
	// max continuations per stream; deadline for a replica to take this one.
	max      int
	deadline time.Time
	// taken: this break was counted as one of the stream's continuations (a retry of
	// its continuation, or the next choice's with n > 1, is not another).
	taken bool
	// refusal is why a replica refused the continuation with a 400 (the text sent
	// does not follow the output's grammar, the template cannot leave the message
	// open): another replica would refuse it too.
	refusal string
}

// decideContinuation says whether a broken stream is continued now, and if not why
// (an outcome of stream_continuations_total).
func decideContinuation(c continuation, now time.Time) (bool, string) {
	switch {
	case c.max <= 0:
		return false, contDisabled
	case c.refusal != "":
		return false, contRefused
	case c.st.whole():
		return false, contFinished
	case c.st.toolCalls:
		return false, contToolCall
	case c.st.strayItem:
		return false, contReasoning
	case c.shape.n > 1 && !c.st.tokens.known(), c.st.api == completionsAPI:
		return false, contShape
	case !c.taken && c.st.continued >= c.max:
		return false, contLimit
	case !now.Before(c.deadline):
		return false, contDeadline
	}
	return true, contContinued
}

// spliceFor is the record of a request's stream: a Chat Completions, Responses or
// Messages request's (nil otherwise), which the gateway reads, counts and may continue
// (with continuations off, decideContinuation says so).
func (g *Gateway) spliceFor(r *http.Request) *spliced {
	api, ok := apiOf(r.URL.Path)
	if !ok {
		return nil
	}
	return &spliced{api: api}
}

// openAnswer is what a client has of the answer a continuation continues: its text,
// reasoning, and (Responses) the logprobs of its text.
type openAnswer struct {
	text, reasoning string
	logprobs        []json.RawMessage
}

// continuationBody is the request body of api with the answer already sent appended
// as the assistant's message: to a chat's or a Messages request's messages, to a
// Responses request's input (a string input becomes the user's message before it).
// The message carries the reasoning sent (assistantMessage; a Responses request's as a
// reasoning item right before it) and a Responses request's its text's logprobs (as
// its output_text part's); one: the continuation is of one choice of several (n is
// dropped).
func continuationBody(api streamAPI, body []byte, a openAnswer, one bool) ([]byte, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	if one {
		delete(req, "n")
	}
	field := "messages"
	if api == responsesAPI {
		field = "input"
	}
	var msgs []json.RawMessage
	if api == responsesAPI && len(req[field]) > 0 && req[field][0] == '"' {
		user, err := json.Marshal(map[string]json.RawMessage{"role": json.RawMessage(`"user"`), "content": req[field]})
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, user)
	} else if err := json.Unmarshal(req[field], &msgs); err != nil {
		return nil, fmt.Errorf("reading %s: %w", field, err)
	}
	if api == responsesAPI && a.reasoning != "" { // the reasoning item before the message (resumedReasoning)
		rs, err := json.Marshal(map[string]any{"type": "reasoning", "summary": []any{},
			"content": []map[string]string{{"type": "reasoning_text", "text": a.reasoning}}})
		if err != nil {
			return nil, err
		}
		msgs, a.reasoning = append(msgs, rs), ""
	}
	m, err := assistantMessage(api, a)
	if err != nil {
		return nil, err
	}
	if req[field], err = json.Marshal(append(msgs, m)); err != nil {
		return nil, err
	}
	return json.Marshal(req)
}

// assistantMessage is the assistant's open message of a continuation of api: its text
// (with its logprobs, a Responses output_text part), and its reasoning as a chat's
// reasoning_content or a Messages thinking block before the text block.
func assistantMessage(api streamAPI, a openAnswer) ([]byte, error) {
	switch {
	case api == messagesAPI && a.reasoning != "":
		blocks := []map[string]string{{"type": "thinking", "thinking": a.reasoning, "signature": ""}}
		if a.text != "" {
			blocks = append(blocks, map[string]string{"type": "text", "text": a.text})
		}
		return json.Marshal(map[string]any{"role": "assistant", "content": blocks})
	case api == responsesAPI && len(a.logprobs) > 0:
		return json.Marshal(map[string]any{"role": "assistant", "content": []map[string]any{
			{"type": "output_text", "text": a.text, "annotations": []any{}, "logprobs": a.logprobs}}})
	}
	return json.Marshal(struct {
		Role      string `json:"role"`
		Content   string `json:"content"`
		Reasoning string `json:"reasoning_content,omitempty"`
	}{"assistant", a.text, a.reasoning})
}

// continueStream continues the stream that res broke off on another replica, as long
// as decideContinuation allows; the client gets the held error when it does not. n is
// the request's attempts so far.
func (g *Gateway) continueStream(ctx context.Context, p *proxied, n int, res outcome) outcome {
	model := p.t.model
	c := continuation{brk: res.broken.brk, st: res.broken.st, failed: res.broken.backend, shape: shapeOf(res.broken.st.api, p.body),
		max: g.opts.StreamContinuations, deadline: time.Now().Add(g.opts.ContinueTimeout)}
	c.st.n = c.shape.n
	if left := c.st.unfinished(); c.st.n > 1 && len(left) > 0 {
		c.st.choice = left[0]
	}
	span := trace.SpanFromContext(ctx)
	backoff := minBackoff // across tries: a replica that keeps failing is tried less and less often
	for {
		ok, why := decideContinuation(c, time.Now())
		if ok && ctx.Err() == nil {
			if !c.taken {
				c.st.continued, c.taken = c.st.continued+1, true
			}
			var rt *Route
			var be Backend
			if rt, be, ok = g.continuationReplica(ctx, p, c.deadline, &backoff); !ok {
				why = contDeadline
			} else {
				from := c.st.textOf(c.st.choice).Len()
				n++
				res = g.continueOn(ctx, p, try{rt: rt, be: be, n: n}, &c)
				if res.broken == nil && res.failure == nil {
					if res.status == http.StatusOK && ctx.Err() == nil && c.st.n > 1 && c.st.nextChoice() {
						// The next choice of several: its own continuation, within this break's.
						c.deadline = time.Now().Add(g.opts.ContinueTimeout)
						continue
					}
					if res.status == http.StatusOK && ctx.Err() == nil {
						g.continuedOK(p, span, be, c, from)
					}
					return res
				}
				if res.broken != nil {
					c.brk, c.failed, c.taken = res.broken.brk, res.broken.backend, false
				}
				if f := res.failure; f != nil && f.status == http.StatusBadRequest {
					c.refusal = refusalOf(f.body)
				}
				continue
			}
		}
		if ctx.Err() != nil {
			return outcome{status: openaierr.StatusClientGone, reason: "client_gone"}
		}
		g.metrics.continuations.WithLabelValues(model, why).Inc()
		span.AddEvent("stream_not_continued", trace.WithAttributes(attribute.String("macfleet.reason", why)))
		if c.st.api == chatAPI && (why == contToolCall || why == contFinished) {
			return g.endCleanly(p, c, why)
		}
		return g.endBroken(p.w, model, c, why)
	}
}

// continuedOK records a stream whose continuation on replica to ended it: its trailer,
// metric and span event (from: the bytes of the continued choice's text the client had
// before).
func (g *Gateway) continuedOK(p *proxied, span trace.Span, to Backend, c continuation, from int) {
	p.w.Header().Set(http.TrailerPrefix+HeaderContinued, strconv.Itoa(c.st.continued))
	g.metrics.continuations.WithLabelValues(p.t.model, contContinued).Inc()
	span.AddEvent("stream_continued", trace.WithAttributes(attribute.String("macfleet.from", c.failed.Key),
		attribute.String("macfleet.to", to.Key), attribute.Int("macfleet.continued_bytes", from)))
}

// continueOn sends the continuation c as attempt tr (its replica and number; the
// body and stream are c's); a failure before its first byte excludes the replica for
// the next try.
func (g *Gateway) continueOn(ctx context.Context, p *proxied, tr try, c *continuation) outcome {
	be := tr.be
	a := openAnswer{text: c.st.textOf(c.st.choice).String(), reasoning: c.st.thoughtOf(c.st.choice).String(), logprobs: c.st.logprobs}
	cbody, err := continuationBody(c.st.api, p.body, a, c.st.n > 1)
	if err != nil { // the replica took the body, so this does not happen
		return outcome{failure: &failure{backend: be, reason: "transport", err: err}}
	}
	g.log.Info("Continuing a broken stream on another replica", "model", p.t.model, "replica", be.Key,
		"cause", c.brk.cause, "err", c.brk.Error(), "choice", c.st.choice, "sentBytes", c.st.textOf(c.st.choice).Len())
	tr.body, tr.st = cbody, c.st
	res := g.attempt(ctx, p, tr)
	g.adm.release(p.t, be.Key)
	if res.failure != nil || res.broken != nil {
		g.adm.exclude(p.t, be.Key)
	}
	return res
}

// notContinued says to the client why its broken stream was not continued.
var notContinued = map[string]string{
	contLimit:     "it was continued as often as the gateway allows (--stream-continuations)",
	contDeadline:  "no other replica took it within --stream-continue-timeout",
	contFinished:  "it had already finished",
	contToolCall:  "it broke in or after a tool call, whose arguments are not resumed: do not run the call",
	contReasoning: "it had a second reasoning item or reasoning after its message, which a continuation cannot name",
	contShape:     "text completions, and streams with n > 1 from a runner that does not count its tokens, are not continued",
	contRefused:   "a replica refused to continue it",
}

// reason is why the stream was not continued, as the client is told.
func (c continuation) reason(why string) string {
	if why == contRefused {
		return notContinued[why] + ": " + c.refusal
	}
	return notContinued[why]
}

// refusalOf is the message of a replica's error body (OpenAI's or Anthropic's shape),
// cut to a line's length.
func refusalOf(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := string(body)
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	if msg == "" {
		msg = "400 Bad Request"
	}
	if len(msg) > 300 {
		cut := 300
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return msg
}

// endBroken ends a stream that is not continued with the replica's error event (the
// gateway's for a connection that broke), saying why it was not continued.
func (g *Gateway) endBroken(w http.ResponseWriter, model string, c continuation, why string) outcome {
	be := c.failed
	g.log.Info("Upstream stream broke after it started; not continued", "model", model,
		"replica", be.Key, "endpoint", be.Endpoint, "err", c.brk.Error(), "why", why)
	e := &apiError{Status: http.StatusBadGateway, Type: openaierr.TypeServer, Code: openaierr.CodeUpstream,
		Message: fmt.Sprintf("the response of replica %s broke off: %v", be.Key, c.brk)}
	if c.st.api == responsesAPI || c.st.api == messagesAPI {
		if reason := c.reason(why); reason != "" {
			e.Message += "; not continued on another replica: " + reason
		}
		_, _ = w.Write(c.st.brokenEvent(e.Message))
		_ = http.NewResponseController(w).Flush()
		return outcome{status: http.StatusOK, reason: "stream_broken"}
	}
	var held struct{ Error *apiError }
	if c.brk.cause == "error_event" && json.Unmarshal(sseData(c.st.held), &held) == nil && held.Error != nil {
		e = held.Error
	}
	if reason := c.reason(why); reason != "" {
		e.Message += "; not continued on another replica: " + reason
	}
	_, _ = w.Write(e.sseEvent())
	_ = http.NewResponseController(w).Flush()
	return outcome{status: http.StatusOK, reason: "stream_broken"}
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
		rt, aerr := tbl.ResolveAs(p.name, p.id)
		if aerr != nil {
			return nil, Backend{}, false
		}
		be, ok, aerr := g.adm.acquire(rt, t)
		if aerr != nil {
			return nil, Backend{}, false
		}
		if ok {
			g.routed(ctx, t)
			return rt, be, true
		}
		bt := time.NewTimer(*backoff)
		select {
		case be := <-t.granted:
			bt.Stop()
			g.routed(ctx, t)
			return rt, be, true
		case <-ctx.Done():
		case <-timer.C:
		case <-tbl.Changed():
			bt.Stop()
			continue
		case <-bt.C:
			g.adm.forgive(rt, t)
			*backoff = min(*backoff*2, maxBackoff)
			continue
		}
		bt.Stop()
		return nil, Backend{}, false
	}
}

package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/tracing"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// maxResponseBytes bounds a non-streamed runner answer the agent buffers.
const maxResponseBytes = 256 << 20

// proxyRequest is one request forwarded to a runner.
type proxyRequest struct {
	path   string
	body   []byte
	stream bool
	// stripUsage drops the usage chunk the agent asked for on the client's behalf.
	stripUsage bool
	// requested is the model name the client sent, served the name the runner
	// answers with; responses carry requested.
	requested, served string
	// generates: a completion (TTFT and token metrics), not embeddings.
	generates bool
	// promptUsage passes runnerapi.HeaderPromptUsage on (only with usage asked for, so
	// that no usage chunk is stripped).
	promptUsage bool
}

// proxy forwards pr to the runner with the client's context, so a client that goes
// away cancels the upstream request and the runner frees its slot. A request the
// gateway named (runnerapi.HeaderRequestID) can also be ended by /api/requests/cancel, which
// keeps its usage (cancel.go). It returns only once the response is completely
// written (or abandoned by the client).
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, lease *enginepool.Lease, rn enginepool.Runner, pr proxyRequest) {
	if e := continueHeadersRefusal(r.Header, callerOf(r)); e != nil {
		writeError(w, e)
		return
	}
	ctx := r.Context()
	sctx, span := s.spans.Start(ctx, "agent.runner", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("macfleet.model", pr.served), attribute.Bool("macfleet.stream", pr.stream)))
	defer span.End()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rn.BaseURL()+pr.path, bytes.NewReader(pr.body))
	if err != nil {
		writeError(w, fromPool(err))
		return
	}
	req.Header.Set("Content-Type", "application/json")
	passFleetHeaders(r, req.Header)
	if s.tracer != nil {
		tracing.Inject(sctx, req.Header)
	}
	if pr.stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if pr.promptUsage {
		req.Header.Set(runnerapi.HeaderPromptUsage, "first-chunk")
	}
	passCountHeaders(r, req.Header, pr.path)
	if v := r.Header.Get(runnerapi.HeaderSpeculation); v != "" && pr.generates {
		req.Header.Set(runnerapi.HeaderSpeculation, v) // changes the speed only, never the answer
	}
	if id := r.Header.Get(runnerapi.HeaderRequestID); id != "" && pr.generates {
		req.Header.Set(runnerapi.HeaderRequestID, id)
		defer s.requests.add(id, rn)()
	}
	resp, err := rn.Client().Do(req)
	if err != nil {
		s.writeUpstreamError(w, r, lease, rn, err)
		return
	}
	defer resp.Body.Close()

	if pr.stream && resp.StatusCode == http.StatusOK &&
		strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		s.copyStream(w, r, lease, rn, resp.Body, pr)
		return
	}

	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		s.writeUpstreamError(w, r, lease, rn, err)
		return
	}
	if resp.StatusCode/100 != 2 {
		s.writeUpstreamError(w, r, lease, rn, upstreamStatus(resp, b))
		return
	}
	if u, ok := answerUsage(b); ok {
		info := requestInfo(ctx)
		info.addUsage(u)
		if pr.generates {
			s.metrics.observeGeneration(pr.served, int(u.Output), time.Since(info.start), false)
		}
	}
	b = rewriteModel(b, pr.served, pr.requested)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(b)
}

// passCountHeaders passes on the gateway's headers of a stream's token count (a chat
// or text completion; a Responses or Messages translator carries the count lines over
// into its own events) and of a continued chat (the runner checks their values).
func passCountHeaders(r *http.Request, out http.Header, path string) {
	var hs []string
	switch path {
	case pathChat:
		hs = []string{runnerapi.HeaderContinue, runnerapi.HeaderContinuedTokens, runnerapi.HeaderContinuedTokenIDs,
			runnerapi.HeaderTokenCounts, runnerapi.HeaderTokenIDs}
	case pathCompletions:
		hs = []string{runnerapi.HeaderTokenCounts}
	}
	for _, h := range hs {
		if v := r.Header.Get(h); v != "" {
			out.Set(h, v)
		}
	}
}

// upstreamStatus turns a runner's non-2xx answer into a *runnerError.
func upstreamStatus(resp *http.Response, b []byte) error {
	return &runnerError{status: resp.StatusCode, body: b, retryAfter: resp.Header.Get("Retry-After")}
}

// copyStream relays the runner's SSE events one by one, flushing each, so tokens reach
// the client as they are generated. Events pass through as bytes; only the "model"
// field is rewritten when the client named the model by an alias, and the usage chunk
// is dropped when the client did not ask for it. A stream that ends without [DONE] or
// an error event (the runner died, the connection broke) gets a final error event.
func (s *Server) copyStream(w http.ResponseWriter, r *http.Request, lease *enginepool.Lease, rn enginepool.Runner, body io.Reader, pr proxyRequest) {
	ctx := r.Context()
	info := requestInfo(ctx)
	startEventStream(w)
	rc := http.NewResponseController(w)

	rewrite := newModelRewrite(pr.served, pr.requested)
	var (
		br      = bufio.NewReaderSize(body, 32<<10)
		event   []byte
		ended   bool
		tally   = streamTally{completion: -1}
		readErr error
	)
	for !ended {
		line, err := readLine(br, maxEventBytes-len(event))
		if len(line) > 0 {
			event = append(event, line...)
		}
		if errors.Is(err, errEventTooLarge) {
			s.endOversizedStream(w, rc, pr.served)
			return
		}
		if err != nil {
			readErr = err
			break
		}
		if !isBlank(line) {
			continue
		}
		// One complete event.
		var drop bool
		ended, drop = inspectEvent(eventData(event), pr.stripUsage, &tally)
		if drop {
			event = event[:0]
			continue
		}
		out := rewrite.apply(event)
		if _, err := w.Write(out); err != nil {
			return // the client went away; returning closes the upstream request
		}
		if err := rc.Flush(); err != nil {
			return
		}
		if tally.first.IsZero() && pr.generates {
			tally.first = time.Now()
			s.metrics.ttft.WithLabelValues(pr.served).Observe(tally.first.Sub(info.start).Seconds())
		}
		event = event[:0]
	}
	if !ended {
		s.endBrokenStream(ctx, w, rc, lease, rn, pr.served, readErr)
		return
	}
	if tally.completion >= 0 {
		info.addUsage(tally.usage)
	}
	if pr.generates && tally.completion >= 0 && !tally.first.IsZero() {
		s.metrics.observeGeneration(pr.served, tally.completion, time.Since(tally.first), true)
	}
}

// startEventStream writes the headers of an SSE answer and its 200 status.
func startEventStream(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
}

// streamTally is what copyStream has counted of a stream so far.
type streamTally struct {
	first      time.Time      // when the first event reached the client
	completion int            // the answer's output tokens; -1 until a usage chunk came
	usage      metering.Usage // the usage chunk's counts
}

// inspectEvent reads one complete event's data: whether it ends the stream ([DONE] or
// an error event) and whether it is dropped (a usage chunk the client did not ask for).
// A usage chunk's counts go into t.
func inspectEvent(data []byte, stripUsage bool, t *streamTally) (ended, drop bool) {
	switch {
	case bytes.Equal(data, []byte("[DONE]")):
		return true, false
	case bytes.HasPrefix(data, []byte(`{"error"`)):
		return true, false
	case bytes.Contains(data, []byte(`"usage":`)):
		if u, ok := answerUsage(data); ok {
			t.usage, t.completion = u, int(u.Output)
		}
		return false, stripUsage
	}
	return false, false
}

// endBrokenStream ends a stream that stopped without [DONE] or an error event with a
// final error event, unless the client went away first.
func (s *Server) endBrokenStream(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, lease *enginepool.Lease, rn enginepool.Runner, served string, readErr error) {
	if ctx.Err() != nil {
		return
	}
	if readErr == nil || readErr == io.EOF {
		readErr = io.ErrUnexpectedEOF
	}
	e := s.upstreamFailure(ctx, lease, rn, fmt.Errorf("the runner's stream broke off: %w", readErr))
	if e == nil {
		return
	}
	s.log.Info("Stream ended by an error", "model", served, "err", e.Message)
	_, _ = w.Write(sseError(e))
	_ = rc.Flush()
}

// maxEventBytes bounds one event of a runner's stream that the agent holds: a runner
// that sends a longer one (a broken or hostile model's) ends its stream with an
// error, instead of running the agent, and every replica on the Mac, out of memory.
// The gateway holds the same bound (splice.MaxEventBytes).
const maxEventBytes = 4 << 20

// errEventTooLarge: a line would take an event past maxEventBytes.
var errEventTooLarge = errors.New("an event of the runner's stream is over the bound")

// readLine reads one line including its "\n" (or the tail before EOF), of at most
// room bytes (errEventTooLarge past it).
func readLine(br *bufio.Reader, room int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if len(line) > room {
		return nil, errEventTooLarge
	}
	if err != bufio.ErrBufferFull {
		return line, err
	}
	long := append([]byte(nil), line...)
	for err == bufio.ErrBufferFull {
		line, err = br.ReadSlice('\n')
		if len(long)+len(line) > room {
			return nil, errEventTooLarge
		}
		long = append(long, line...)
	}
	return long, err
}

// endOversizedStream ends a stream whose runner sent an event over maxEventBytes
// with an error event saying so (the runner's stream is closed as copyStream returns).
func (s *Server) endOversizedStream(w http.ResponseWriter, rc *http.ResponseController, served string) {
	e := &apiError{Status: http.StatusBadGateway, Type: openaierr.TypeServer, Code: openaierr.CodeUpstream,
		Message: fmt.Sprintf("the runner of model %q sent an event over %d bytes: the stream is ended", served, maxEventBytes)}
	s.log.Info("Stream ended by an error", "model", served, "err", e.Message)
	_, _ = w.Write(sseError(e))
	_ = rc.Flush()
}

func isBlank(line []byte) bool { return len(bytes.TrimRight(line, "\r\n")) == 0 }

// eventData is the payload of an event's data lines. The runner sends one data line
// per event, which is returned without copying.
func eventData(event []byte) []byte {
	var data []byte
	lines := 0
	for len(event) > 0 {
		line := event
		if i := bytes.IndexByte(event, '\n'); i >= 0 {
			line, event = event[:i], event[i+1:]
		} else {
			event = nil
		}
		line = bytes.TrimRight(line, "\r")
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		v = bytes.TrimPrefix(v, []byte(" "))
		switch lines++; lines {
		case 1:
			data = v
		case 2:
			data = append(append(append([]byte(nil), data...), '\n'), v...)
		default:
			data = append(append(data, '\n'), v...)
		}
	}
	return data
}

// answerUsage reads the usage of a runner's answer or stream chunk (the last chunk's
// counts the whole answer); ok false when it has none.
func answerUsage(data []byte) (metering.Usage, bool) {
	var c struct {
		Usage *runnerapi.Usage `json:"usage"`
	}
	if json.Unmarshal(data, &c) != nil || c.Usage == nil {
		return metering.Usage{}, false
	}
	u := metering.Usage{Input: int64(c.Usage.PromptTokens), Output: int64(c.Usage.CompletionTokens)}
	if d := c.Usage.PromptTokensDetails; d != nil {
		u.Cached = int64(d.CachedTokens)
	}
	return u, true
}

// modelRewrite replaces the runner's "model" value by the name the client used. The
// runner sends the served name, JSON-encoded identically every time; the same bytes
// inside generated text would be escaped ("\"model\"") and so never match.
type modelRewrite struct{ from, to []byte }

func newModelRewrite(served, requested string) *modelRewrite {
	if served == requested {
		return nil
	}
	from, _ := json.Marshal(served)
	to, _ := json.Marshal(requested)
	return &modelRewrite{from: append([]byte(`"model":`), from...), to: append([]byte(`"model":`), to...)}
}

// apply rewrites the first "model" field of b; a nil rewrite returns b.
func (m *modelRewrite) apply(b []byte) []byte {
	if m == nil {
		return b
	}
	return bytes.Replace(b, m.from, m.to, 1)
}

func rewriteModel(b []byte, served, requested string) []byte {
	return newModelRewrite(served, requested).apply(b)
}

// withUsage sets stream_options.include_usage in a request body.
func withUsage(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := m["stream_options"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if err := json.Unmarshal(raw, &opts); err != nil {
			return nil, err
		}
	}
	opts["include_usage"] = json.RawMessage("true")
	b, err := json.Marshal(opts)
	if err != nil {
		return nil, err
	}
	m["stream_options"] = b
	return json.Marshal(m)
}

// callRunner does one JSON request to a runner under ctx; a non-2xx answer is a
// *runnerError.
func callRunner(ctx context.Context, rn enginepool.Runner, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rn.BaseURL()+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := rn.Client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return upstreamStatus(resp, rb)
	}
	if err := json.Unmarshal(rb, out); err != nil {
		return fmt.Errorf("decoding the runner's answer to %s: %w", path, err)
	}
	return nil
}

// writeUpstreamError answers a request whose runner call failed before anything was
// written: the runner's own error passes through; a broken connection says whether
// the runner died. Nothing is written if the client has gone.
func (s *Server) writeUpstreamError(w http.ResponseWriter, r *http.Request, lease *enginepool.Lease, rn enginepool.Runner, err error) {
	if re, ok := asRunnerError(err); ok && json.Valid(re.body) {
		re.write(w)
		return
	}
	if e := s.upstreamFailure(r.Context(), lease, rn, err); e != nil {
		writeError(w, e)
	}
}

// upstreamFailure explains a failed runner call: nil when the client went away (there
// is no one to tell), 503 engine_stopped + Retry-After when the runner stopped or died
// (the pool marks it Failed and the next request reloads it after its backoff), 502
// otherwise.
func (s *Server) upstreamFailure(ctx context.Context, lease *enginepool.Lease, rn enginepool.Runner, err error) *apiError {
	if ctx.Err() != nil {
		return nil
	}
	// A connection that broke because the runner died is usually noticed here before
	// the process is reaped: give the reaper a moment to say so.
	t := time.NewTimer(s.opts.ExitWait)
	defer t.Stop()
	select {
	case <-rn.Exited():
	case <-lease.Done():
	case <-ctx.Done():
		return nil
	case <-t.C:
	}
	if perr := lease.Err(); perr != nil {
		return fromPool(perr)
	}
	select {
	case <-rn.Exited():
		msg := fmt.Sprintf("the engine of model %q stopped", lease.Model())
		if xerr := rn.ExitErr(); xerr != nil {
			msg += ": " + xerr.Error()
		}
		return &apiError{Status: http.StatusServiceUnavailable, Type: openaierr.TypeUnavailable, Code: enginepool.CodeEngineStopped,
			Message: msg + "; it will be reloaded by the next request", RetryAfter: time.Second}
	default:
	}
	if re, ok := asRunnerError(err); ok {
		err = errors.New(re.Error())
	}
	return &apiError{Status: http.StatusBadGateway, Type: openaierr.TypeServer, Code: openaierr.CodeUpstream,
		Message: fmt.Sprintf("the runner of model %q failed: %v", lease.Model(), err)}
}

// Package translate serves the OpenAI Responses API (POST /v1/responses) and the
// Anthropic Messages API (POST /v1/messages) over a chat completions handler: each
// request is translated into a chat completion request, and the chat handler's answer
// (a JSON body, an SSE stream of chunks, or an OpenAI-shaped error) back into the
// API's own shapes and events, incrementally. The translations are pure functions
// (request → chat request, chat completion → response, a stream state machine chunk
// → events); this file is the HTTP plumbing they share.
package translate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/compat"
)

// MaxBodyBytes bounds a translated request body.
const MaxBodyBytes = 16 << 20

// chatError is an error of the chat handler or of a translation, in OpenAI's terms.
type chatError struct {
	Status  int
	Message string
	Type    string
	Code    string
	Param   string
}

func invalid(param, format string, args ...any) *chatError {
	e := runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, format, args...)
	return &chatError{Status: e.Status, Message: e.Message, Type: e.Type, Code: e.Code, Param: e.Param}
}

func unsupported(param, format string, args ...any) *chatError {
	e := runnerapi.InvalidRequest(runnerapi.CodeUnsupportedParameter, param, format, args...)
	return &chatError{Status: e.Status, Message: e.Message, Type: e.Type, Code: e.Code, Param: e.Param}
}

// decodeStrict decodes body into v, refusing unknown fields and trailing data. An
// unknown field is named by its whole path, below root (the path of body in the
// request, "" for the request itself): "tools[10].defer_loading". A top-level field
// the policy p refuses whatever its value is refused with the policy's reason (p is
// nil for a nested object).
func decodeStrict(body []byte, v any, p *compat.Policy, root string) *chatError {
	e := runnerapi.DecodeJSON(body, v)
	if e == nil {
		return nil
	}
	if e.Code == runnerapi.CodeUnknownParameter {
		field := e.Param
		if path, ok := unknownPath(body, reflect.TypeOf(v)); ok {
			field = path
		}
		field = below(root, field)
		if msg, ok := refusal(p, field); ok {
			return unsupported(field, "%s", msg)
		}
		e = runnerapi.InvalidRequest(runnerapi.CodeUnknownParameter, field, "unknown or unsupported field %q", field)
	} else if e.Param != "" {
		e.Param = below(root, e.Param)
	}
	return &chatError{Status: e.Status, Message: e.Message, Type: e.Type, Code: e.Code, Param: e.Param}
}

// below is the path of field inside the value at root.
func below(root, field string) string {
	if root == "" || strings.HasPrefix(field, "[") {
		return root + field
	}
	return root + "." + field
}

// refusal is p's refusal of a top-level field; a nil p (a nested object) has none.
func refusal(p *compat.Policy, field string) (string, bool) {
	if p == nil {
		return "", false
	}
	return p.Refusal(field)
}

// setHints names the request's hints accepted without effect in the response header.
func setHints(w http.ResponseWriter, hints []string) {
	if v := compat.HeaderValue(hints); v != "" {
		w.Header().Set(compat.IgnoredHintsHeader, v)
	}
}

// readBody reads a request body, bounded.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *chatError) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		return nil, &chatError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Code: "request_too_large", Message: "reading the request body: " + err.Error()}
	}
	return b, nil
}

// sink receives the chat handler's answer, translated as it arrives.
type sink interface {
	// whole is a non-streamed chat completion.
	whole(c *runnerapi.ChatCompletion)
	// chunk is one chunk of a stream (the first call starts the stream).
	chunk(c *runnerapi.ChatCompletionChunk)
	// end ends a stream: err is set when it broke (an error event, or the handler
	// stopped without [DONE]).
	end(err *chatError)
	// fail answers with an error before anything was sent.
	fail(e *chatError)
}

// serveChat runs the chat handler on chatBody and feeds its answer to out.
func serveChat(next http.Handler, r *http.Request, chatBody []byte, out sink) {
	req := r.Clone(r.Context())
	req.URL.Path = "/v1/chat/completions"
	req.RequestURI = "/v1/chat/completions"
	req.Body = io.NopCloser(bytes.NewReader(chatBody))
	req.ContentLength = int64(len(chatBody))
	req.Header.Set("Content-Length", strconv.Itoa(len(chatBody)))
	req.Header.Set("Content-Type", "application/json")
	// A stream's first chunk carries the prompt's usage (Anthropic's message_start
	// reports it before any content).
	req.Header.Set(runnerapi.HeaderPromptUsage, "first-chunk")
	cw := &captureWriter{header: http.Header{}, out: out}
	next.ServeHTTP(cw, req)
	cw.finish()
}

// captureWriter is the chat handler's ResponseWriter: it buffers a JSON answer or an
// error, and parses an SSE stream line by line as the handler flushes it.
type captureWriter struct {
	header  http.Header
	status  int
	out     sink
	stream  bool
	buf     bytes.Buffer // the whole body (JSON) or the unparsed tail (SSE)
	done    bool         // [DONE] seen
	errored bool         // an error event seen
}

func (c *captureWriter) Header() http.Header { return c.header }

func (c *captureWriter) WriteHeader(status int) {
	if c.status != 0 {
		return
	}
	c.status = status
	c.stream = status == http.StatusOK && strings.HasPrefix(c.header.Get("Content-Type"), "text/event-stream")
}

func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	c.buf.Write(p)
	if c.stream {
		c.parse(false)
	}
	return len(p), nil
}

// Flush is called when the chat handler flushes; events are already handed on.
func (c *captureWriter) Flush() {}

// parse hands every complete SSE event in the buffer to the sink.
func (c *captureWriter) parse(final bool) {
	for {
		b := c.buf.Bytes()
		i := bytes.Index(b, []byte("\n\n"))
		if i < 0 {
			if !final || len(bytes.TrimSpace(b)) == 0 {
				return
			}
			i = len(b)
		}
		event := string(b[:i])
		c.buf.Next(min(i+2, len(b)))
		sc := bufio.NewScanner(strings.NewReader(event))
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				if cs, counts := c.out.(counted); counts && isCount(sc.Text()) {
					cs.count(sc.Text())
				}
				continue
			}
			c.data(data)
		}
	}
}

func (c *captureWriter) data(data string) {
	if data == "[DONE]" {
		c.done = true
		return
	}
	var probe struct {
		Error *struct {
			Message, Type, Code string
		} `json:"error"`
		Message string `json:"message"`
		Type    string `json:"type"`
	}
	if json.Unmarshal([]byte(data), &probe) == nil && (probe.Error != nil || probe.Message != "" && probe.Type != "") {
		e := &chatError{Status: http.StatusInternalServerError, Message: probe.Message, Type: probe.Type}
		if probe.Error != nil {
			e.Message, e.Type, e.Code = probe.Error.Message, probe.Error.Type, probe.Error.Code
		}
		c.errored = true
		c.out.end(e)
		return
	}
	var ch runnerapi.ChatCompletionChunk
	if json.Unmarshal([]byte(data), &ch) == nil {
		c.out.chunk(&ch)
	}
}

func (c *captureWriter) finish() {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	switch {
	case c.stream:
		c.parse(true)
		if !c.errored {
			var err *chatError
			if !c.done {
				err = &chatError{Status: http.StatusBadGateway, Type: "api_error", Message: "the model's stream ended early"}
			}
			c.out.end(err)
		}
	case c.status != http.StatusOK:
		c.out.fail(parseError(c.status, c.buf.Bytes()))
	default:
		var cc runnerapi.ChatCompletion
		if err := json.Unmarshal(c.buf.Bytes(), &cc); err != nil || len(cc.Choices) == 0 {
			c.out.fail(&chatError{Status: http.StatusBadGateway, Type: "api_error", Message: "the chat answer did not decode"})
			return
		}
		c.out.whole(&cc)
	}
}

// parseError reads an OpenAI error body.
func parseError(status int, body []byte) *chatError {
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    string  `json:"code"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	out := &chatError{Status: status, Message: strings.TrimSpace(string(body)), Type: "api_error"}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		out.Message, out.Type, out.Code = e.Error.Message, e.Error.Type, e.Error.Code
		if e.Error.Param != nil {
			out.Param = *e.Error.Param
		}
	}
	return out
}

// sse writes server-sent events with an event line, flushing each; comment, when set,
// goes before the next one (a count line of the runner's: see counted).
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	comment string
}

func newSSE(w http.ResponseWriter) *sse { return &sse{w: w, rc: http.NewResponseController(w)} }

func (s *sse) send(event string, v any) {
	if !s.started {
		h := s.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		s.w.WriteHeader(http.StatusOK)
		s.started = true
	}
	b, _ := json.Marshal(v)
	if s.comment != "" {
		_, _ = io.WriteString(s.w, s.comment+"\n")
		s.comment = ""
	}
	_, _ = io.WriteString(s.w, "event: "+event+"\ndata: ")
	_, _ = s.w.Write(b)
	_, _ = io.WriteString(s.w, "\n\n")
	_ = s.rc.Flush()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// argsObject turns a call's arguments string into a JSON object (an empty object
// when they are not one).
func argsObject(args string) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal([]byte(args), &m) != nil {
		return json.RawMessage("{}")
	}
	return json.RawMessage(args)
}

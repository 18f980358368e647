// Package openaierr is what the two OpenAI front ends of macfleet — the node agent's
// API and the gateway — send when something goes wrong: the OpenAI error response
// {"error":{"message","type","param","code",...}} with its headers, the same error as
// the last event of a stream that had already started, and the middleware that turns
// a handler panic into one.
package openaierr

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/go-logr/logr"
)

// OpenAI error types.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable"
	TypeRateLimit      = "rate_limit_error"
)

// CodeInternal is the code of an unexpected server error.
const CodeInternal = "internal_error"

// Codes both front ends send for the same failure, defined once so that a client
// sees one vocabulary whichever of them answered; each front end keeps the codes only
// it sends.
const (
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidValue     = "invalid_value"
	CodeMissingField     = "missing_required_parameter"
	CodeRequestTooLarge  = "request_too_large"
	CodeInvalidAPIKey    = "invalid_api_key"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeUpstream         = "upstream_error"
	// CodeTokenReview: a ServiceAccount token could not be reviewed now (the API
	// server did not answer the TokenReview); the client retries.
	CodeTokenReview = "token_review_unavailable"
	// CodeTokenReviewLimited: a ServiceAccount token this server has no answer for
	// was not reviewed: its source, or every source, presented more unknown tokens
	// than the reviews allow; the client retries after Retry-After.
	CodeTokenReviewLimited = "token_review_limited"
)

// StatusClientGone is the status both front ends record (in their request metrics,
// logs and spans), never send, for a request whose client went away before it was
// answered.
const StatusClientGone = 499

// Error is one error response: its status, the OpenAI error body and an optional
// Retry-After.
type Error struct {
	Status     int
	Type       string
	Code       string
	Message    string
	Param      string
	RetryAfter time.Duration
	// Fields are extra members of the error object (estimated_bytes, limit_bytes…);
	// they never replace the standard ones.
	Fields map[string]any
}

func (e *Error) Error() string { return e.Message }

// Body is the OpenAI error body; param is null when empty.
func (e *Error) Body() map[string]any {
	obj := map[string]any{"message": e.Message, "type": e.Type, "param": nil, "code": e.Code}
	if e.Param != "" {
		obj["param"] = e.Param
	}
	for k, v := range e.Fields {
		if _, taken := obj[k]; !taken {
			obj[k] = v
		}
	}
	return map[string]any{"error": obj}
}

// Write sends e as the whole response, with Retry-After (whole seconds, at least 1)
// when set and a Bearer challenge on a 401. Nothing may have been written before.
func (e *Error) Write(w http.ResponseWriter) {
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
	}
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="macfleet"`)
	}
	WriteJSON(w, e.Status, e.Body())
}

// SSEEvent renders e as the final event of a stream whose status was already sent.
func (e *Error) SSEEvent() []byte {
	b, _ := json.Marshal(e.Body())
	return append(append([]byte("data: "), b...), '\n', '\n')
}

// WriteJSON sends v as a JSON response with status; a value that cannot be encoded
// becomes a 500 error.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal((&Error{Status: status, Type: TypeServer, Code: CodeInternal,
			Message: "encoding the response: " + err.Error()}).Body())
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// StatusWriter remembers the status sent (0 while nothing was). Flush and Unwrap keep
// http.ResponseController (flushes, deadlines) working through it.
type StatusWriter struct {
	http.ResponseWriter
	Status int
}

func (w *StatusWriter) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *StatusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Recover turns a handler panic into a logged 500 with message when nothing was sent
// yet, so that one bad request never takes the server down; after the status it
// aborts the response so the client sees a failure. It is a last resort: handlers
// validate their input.
func Recover(next http.Handler, log logr.Logger, message string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &StatusWriter{ResponseWriter: w}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(v)
			}
			log.Error(nil, "Handler panicked", "method", r.Method, "path", r.URL.Path, "panic", v)
			if sw.Status == 0 {
				(&Error{Status: http.StatusInternalServerError, Type: TypeServer, Code: CodeInternal,
					Message: message}).Write(sw)
				return
			}
			panic(http.ErrAbortHandler)
		}()
		next.ServeHTTP(sw, r)
	})
}

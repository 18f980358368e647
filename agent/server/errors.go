package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// The agent's own errors use the OpenAI error types and the codes it shares with the
// gateway from internal/openaierr (the pool's errors carry their own), and these only
// the agent sends.
const (
	typePermission = "permission_error"
	// codeForbiddenCaller: a fleet certificate whose identity may not make this call
	// (a Mac's on anything, a metrics scraper's beyond /metrics).
	codeForbiddenCaller = "forbidden_caller"
)

// apiError is one error response of the agent (internal/openaierr).
type apiError = openaierr.Error

func invalid(code, param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: openaierr.TypeInvalidRequest, Code: code, Param: param,
		Message: fmt.Sprintf(format, args...)}
}

// writeError sends e as the whole response. It must be called before anything else
// was written.
func writeError(w http.ResponseWriter, e *apiError) { e.Write(w) }

// sseError renders e as the final event of a stream whose status line was already sent.
func sseError(e *apiError) []byte { return e.SSEEvent() }

func writeJSON(w http.ResponseWriter, status int, v any) { openaierr.WriteJSON(w, status, v) }

// fromPool maps an error of the engine pool. The pool's errors carry their status,
// code and Retry-After (enginepool.StatusError); anything else is a bug or an interrupted
// wait and becomes a 500 or a 503.
func fromPool(err error) *apiError {
	if se, ok := enginepool.AsStatusError(err); ok {
		return &apiError{Status: se.HTTPStatus(), Type: se.Type(), Code: se.Code(), Message: se.Error(),
			RetryAfter: se.RetryAfter(), Fields: se.Fields()}
	}
	return &apiError{Status: http.StatusInternalServerError, Type: openaierr.TypeServer, Code: openaierr.CodeInternal,
		Message: err.Error()}
}

// fromRunnerAPI maps a validation error of the shared request types.
func fromRunnerAPI(e *runnerapi.Error) *apiError {
	out := &apiError{Status: e.Status, Type: e.Type, Code: e.Code, Message: e.Message, Param: e.Param}
	if e.EstimatedBytes > 0 || e.LimitBytes > 0 {
		out.Fields = map[string]any{"estimated_bytes": e.EstimatedBytes, "limit_bytes": e.LimitBytes}
	}
	if e.Status == http.StatusServiceUnavailable {
		out.RetryAfter = time.Second
	}
	return out
}

// runnerError is a non-2xx answer of a runner: its status and OpenAI error body,
// passed through to the client.
type runnerError struct {
	status     int
	body       []byte
	retryAfter string
}

func (e *runnerError) Error() string {
	var eb runnerapi.ErrorBody
	if json.Unmarshal(e.body, &eb) == nil && eb.Error.Message != "" {
		return fmt.Sprintf("runner answered %d: %s", e.status, eb.Error.Message)
	}
	return fmt.Sprintf("runner answered %d", e.status)
}

func (e *runnerError) write(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	if e.retryAfter != "" {
		w.Header().Set("Retry-After", e.retryAfter)
	} else if e.status == http.StatusServiceUnavailable || e.status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(e.status)
	_, _ = w.Write(e.body)
}

// asRunnerError finds a *runnerError in err's chain.
func asRunnerError(err error) (*runnerError, bool) {
	var re *runnerError
	return re, errors.As(err, &re)
}

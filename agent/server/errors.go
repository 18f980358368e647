package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/macfleet/macfleet/metal"
	"github.com/macfleet/macfleet/runner/api"
)

// OpenAI error types of the agent's own errors (the pool's carry their own).
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable"
)

// Error codes of the agent's own errors.
const (
	codeInvalidJSON      = "invalid_json"
	codeInvalidValue     = "invalid_value"
	codeMissingField     = "missing_required_parameter"
	codeRequestTooLarge  = "request_too_large"
	codeInvalidAPIKey    = "invalid_api_key"
	codeNotFound         = "not_found"
	codeMethodNotAllowed = "method_not_allowed"
	codeUpstream         = "upstream_error"
	codeInternal         = "internal_error"
)

// apiError is one error response: its status, the OpenAI error body
// {"error":{"message","type","param","code",...fields}} and an optional Retry-After.
type apiError struct {
	Status     int
	Type       string
	Code       string
	Message    string
	Param      string
	RetryAfter time.Duration
	// Fields are extra members of the error object (estimated_bytes, limit_bytes…).
	Fields map[string]any
}

func (e *apiError) Error() string { return e.Message }

func invalid(code, param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: code, Param: param,
		Message: fmt.Sprintf(format, args...)}
}

// body renders the OpenAI error body.
func (e *apiError) body() map[string]any {
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

// writeError sends e as the whole response. It must be called before anything else
// was written.
func writeError(w http.ResponseWriter, e *apiError) {
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
	}
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="macfleet"`)
	}
	writeJSON(w, e.Status, e.body())
}

// sseError renders e as the final event of a stream whose status line was already sent.
func sseError(e *apiError) []byte {
	b, _ := json.Marshal(e.body())
	return append(append([]byte("data: "), b...), '\n', '\n')
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal((&apiError{Status: status, Type: typeServer, Code: codeInternal,
			Message: "encoding the response: " + err.Error()}).body())
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// fromPool maps an error of the engine pool. The pool's errors carry their status,
// code and Retry-After (metal.StatusError); anything else is a bug or an interrupted
// wait and becomes a 500 or a 503.
func fromPool(err error) *apiError {
	if se, ok := metal.AsStatusError(err); ok {
		return &apiError{Status: se.HTTPStatus(), Type: se.Type(), Code: se.Code(), Message: se.Error(),
			RetryAfter: se.RetryAfter(), Fields: se.Fields()}
	}
	return &apiError{Status: http.StatusInternalServerError, Type: typeServer, Code: codeInternal,
		Message: err.Error()}
}

// fromRunnerAPI maps a validation error of the shared request types.
func fromRunnerAPI(e *api.Error) *apiError {
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
	var eb api.ErrorBody
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

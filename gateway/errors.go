package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// OpenAI error types, as the node agent uses them.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable"
)

// Error codes of the gateway's own errors.
const (
	codeModelNotFound    = "model_not_found"
	codeAmbiguousModel   = "ambiguous_model"
	codeInvalidJSON      = "invalid_json"
	codeMissingField     = "missing_required_parameter"
	codeInvalidValue     = "invalid_value"
	codeRequestTooLarge  = "request_too_large"
	codeInvalidAPIKey    = "invalid_api_key"
	codeNotFound         = "not_found"
	codeNoReplica        = "no_ready_replica"
	codeUpstream         = "upstream_error"
	codeMethodNotAllowed = "method_not_allowed"
)

// apiError is one error response of the gateway itself: its status, the OpenAI error
// body {"error":{"message","type","param","code"}} and an optional Retry-After.
type apiError struct {
	Status     int
	Type       string
	Code       string
	Message    string
	Param      string
	RetryAfter time.Duration
	// reason labels macfleet_gateway_errors_total.
	reason string
}

func (e *apiError) Error() string { return e.Message }

func (e *apiError) body() []byte {
	obj := map[string]any{"message": e.Message, "type": e.Type, "param": nil, "code": e.Code}
	if e.Param != "" {
		obj["param"] = e.Param
	}
	b, _ := json.Marshal(map[string]any{"error": obj})
	return append(b, '\n')
}

// write sends e as the whole response; nothing may have been written before.
func (e *apiError) write(w http.ResponseWriter) {
	h := w.Header()
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
	}
	if e.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="macfleet"`)
	}
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.body())
}

// sseEvent renders e as the last event of a stream whose status was already sent.
func (e *apiError) sseEvent() []byte {
	b := e.body()
	return append(append([]byte("data: "), b[:len(b)-1]...), '\n', '\n')
}

func invalidRequest(code, param, reason, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: code, Param: param,
		Message: fmt.Sprintf(format, args...), reason: reason}
}

func modelNotFound(model string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: codeModelNotFound, Param: "model",
		Message: fmt.Sprintf("model %q is not served by this fleet: no ModelDeployment serves it under that name "+
			"or alias (GET /v1/models lists them)", model), reason: "model_not_found"}
}

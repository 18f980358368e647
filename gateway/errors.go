package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/chat/translate"

	"github.com/macfleet/macfleet/internal/openaierr"
)

// typeRateLimit is a 429's type (the Anthropic API's too); the other OpenAI error
// types, and the codes the gateway shares with the node agent, are internal/openaierr's.
const typeRateLimit = openaierr.TypeRateLimit

// Error codes only the gateway sends.
const (
	codeModelNotFound  = "model_not_found"
	codeAmbiguousModel = "ambiguous_model"
	codeNoReplica      = "no_ready_replica"
	codeQueueFull      = "queue_full"
	codeQueueTimeout   = "queue_timeout"
	codeStarting       = "gateway_starting"
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

// wire is e as the OpenAI error response the agent sends too (internal/openaierr).
func (e *apiError) wire() *openaierr.Error {
	return &openaierr.Error{Status: e.Status, Type: e.Type, Code: e.Code, Message: e.Message, Param: e.Param,
		RetryAfter: e.RetryAfter}
}

// write sends e as the whole response; nothing may have been written before.
func (e *apiError) write(w http.ResponseWriter) { e.wire().Write(w) }

// sseEvent renders e as the last event of a stream whose status was already sent.
func (e *apiError) sseEvent() []byte { return e.wire().SSEEvent() }

func invalidRequest(code, param, reason, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: openaierr.TypeInvalidRequest, Code: code, Param: param,
		Message: fmt.Sprintf(format, args...), reason: reason}
}

func modelNotFound(model string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: openaierr.TypeInvalidRequest, Code: codeModelNotFound, Param: "model",
		Message: fmt.Sprintf("model %q is not served by this fleet: no ModelDeployment serves it under that name "+
			"or alias (GET /v1/models lists them)", model), reason: "model_not_found"}
}

// resolve is the deployment model names in tbl for the caller id, or the error to
// answer (routing.Table.ResolveAs).
func resolve(tbl *Table, model string, id tenancy.Identity) (*Route, *apiError) {
	rt, no := tbl.ResolveAs(model, id)
	if no == nil {
		return rt, nil
	}
	switch no.Reason {
	case routing.RefusedStarting:
		return nil, gatewayStarting()
	case routing.RefusedNotFound:
		return nil, modelNotFound(model)
	}
	return nil, &apiError{Status: http.StatusBadRequest, Type: openaierr.TypeInvalidRequest, Code: codeAmbiguousModel,
		Param: "model", Message: no.Message, reason: "ambiguous_model"}
}

// queueFull is the 429 of a request the deployment's fair queue has no room for.
func queueFull(f *admission.Full) *apiError {
	return &apiError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: codeQueueFull,
		Message: f.Message, RetryAfter: f.RetryAfter, reason: f.Reason}
}

// wakeError is the 503 of a request whose wake could not be recorded.
func wakeError(err error) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: openaierr.TypeUnavailable, Code: codeNoReplica,
		Message: err.Error(), RetryAfter: coldRetryAfter, reason: "wake_failed"}
}

// gatewayStarting answers a request that arrives before the routing table is built.
func gatewayStarting() *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: openaierr.TypeUnavailable, Code: codeStarting,
		Message: "the gateway is starting: its routing table is not built from the API server yet", RetryAfter: time.Second,
		reason: "starting"}
}

// anthropicErrors answers the gateway's own errors on the Anthropic Messages API in
// that API's shape (the agents already answer theirs so): an OpenAI-shaped error body
// is rewritten, everything else passes through unbuffered.
func anthropicErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/messages" && r.URL.Path != "/v1/messages/count_tokens" {
			next.ServeHTTP(w, r)
			return
		}
		aw := &anthropicErrorWriter{ResponseWriter: w}
		next.ServeHTTP(aw, r)
		if aw.held { // not one JSON object after all: send it as it was
			aw.ResponseWriter.WriteHeader(aw.status)
			_, _ = aw.ResponseWriter.Write(aw.buf)
		}
	})
}

type anthropicErrorWriter struct {
	http.ResponseWriter
	status int
	held   bool // an error body is being held to be rewritten
	buf    []byte
}

func (a *anthropicErrorWriter) WriteHeader(status int) {
	a.status = status
	if status >= 400 && strings.HasPrefix(a.Header().Get("Content-Type"), "application/json") {
		a.held = true
		return
	}
	a.ResponseWriter.WriteHeader(status)
}

func (a *anthropicErrorWriter) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	if !a.held {
		return a.ResponseWriter.Write(p)
	}
	a.buf = append(a.buf, p...)
	// Error bodies are one small JSON object: rewrite it once it is whole.
	if json.Valid(a.buf) {
		body, ok := translate.AnthropicErrorBody(a.status, a.buf)
		if !ok {
			body = a.buf
		}
		a.held = false
		a.Header().Del("Content-Length")
		a.ResponseWriter.WriteHeader(a.status)
		if _, err := a.ResponseWriter.Write(body); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (a *anthropicErrorWriter) Flush() {
	if !a.held {
		_ = http.NewResponseController(a.ResponseWriter).Flush()
	}
}

func (a *anthropicErrorWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

package server

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The agent's spans (docs/tracing.md): a server span per OpenAI request continuing the
// gateway's traceparent, agent.lease (routing; a cold load when the model was not
// loaded), agent.prefill_guard (the prompt's token count and the pool's check) and
// agent.runner, the client span of the call whose traceparent the runner continues.
// Without a tracer there are none: the server span is nil, the others come from a
// no-op tracer (Server.spans), which records nothing.

const tracerName = "github.com/macfleet/macfleet/agent/server"

// endServerSpan records the status and the model on an OpenAI request's server span
// (tracing.StartServer's; nil when tracing is off) and ends it.
func endServerSpan(span trace.Span, model string, status int) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status), attribute.String("macfleet.model", model))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// endSpan ends span, marking it failed with err.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

package server

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/macfleet/macfleet/internal/tracing"
)

// The agent's spans (docs/tracing.md): a server span per OpenAI request continuing the
// gateway's traceparent, agent.lease (routing; a cold load when the model was not
// loaded), agent.prefill_guard (the prompt's token count and the pool's check) and
// agent.runner, the client span of the call whose traceparent the runner continues.
// Without a tracer the spans are no-ops.

const tracerName = "github.com/macfleet/macfleet/agent/server"

// startServerSpan continues the caller's trace for one OpenAI request.
func (s *Server) startServerSpan(r *http.Request) (*http.Request, trace.Span) {
	if s.tracer == nil {
		return r, noop.Span{}
	}
	return tracing.StartServer(s.tracer, r, "agent "+r.Method+" "+r.URL.Path)
}

// endServerSpan records the status and the model.
func endServerSpan(span trace.Span, model string, status int) {
	span.SetAttributes(attribute.Int("http.response.status_code", status), attribute.String("macfleet.model", model))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// startSpan starts an internal (or, with kind, another kind of) child span of ctx's.
func (s *Server) startSpan(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if s.tracer == nil {
		return ctx, noop.Span{}
	}
	return s.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// endSpan ends span, marking it failed with err.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

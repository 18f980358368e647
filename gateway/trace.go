package gateway

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/tracing"
)

// The gateway's spans (docs/tracing.md): one server span per proxied request, a
// gateway.hold span for each wait for a replica (cold start or the fair queue) and a
// gateway.upstream client span per attempt, whose traceparent the agent continues.
// Without a tracer every helper here does nothing.

const tracerName = "github.com/macfleet/macfleet/gateway"

// tagCaller names the caller's key on the request's span (usage is per key).
func tagCaller(ctx context.Context, id tenancy.Identity) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("macfleet.key.namespace", id.Namespace),
			attribute.String("macfleet.key.name", id.Name))
	}
}

// endRequest ends the request's server span (tracing.StartServer's; nil when tracing
// is off) with what became of the request.
func endRequest(span trace.Span, model string, res outcome) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", res.status))
	if model != "" {
		span.SetAttributes(attribute.String("macfleet.deployment", model))
	}
	if res.reason != "" {
		span.SetAttributes(attribute.String("macfleet.outcome", res.reason))
	}
	if u := res.usage; u != nil {
		span.SetAttributes(attribute.Int64("gen_ai.usage.input_tokens", u.Input),
			attribute.Int64("gen_ai.usage.output_tokens", u.Output),
			attribute.Int64("macfleet.usage.cached_tokens", u.Cached))
	}
	if res.status >= 500 || res.abort {
		span.SetStatus(codes.Error, res.reason)
	}
	span.End()
}

// hold is one wait for a replica; a nil *hold (tracing off) does nothing.
type hold struct{ span trace.Span }

// startHold starts a gateway.hold span: why the request waits, and its priority.
func (g *Gateway) startHold(ctx context.Context, rt *Route, t *admission.Ticket) *hold {
	if g.tracer == nil {
		return nil
	}
	reason := "queue"
	if len(rt.Backends) == 0 {
		reason = "cold_start"
	}
	_, span := g.tracer.Start(ctx, "gateway.hold", trace.WithAttributes(
		attribute.String("macfleet.hold.reason", reason), attribute.String("macfleet.priority", t.Request().Priority.String()),
		attribute.Int("macfleet.replicas.routable", len(rt.Backends))))
	return &hold{span: span}
}

// end ends the wait: granted, or how it gave up.
func (h *hold) end(outcome string) {
	if h == nil {
		return
	}
	h.span.SetAttributes(attribute.String("macfleet.hold.outcome", outcome))
	if outcome != "granted" {
		h.span.SetStatus(codes.Error, outcome)
	}
	h.span.End()
}

// startAttempt starts a gateway.upstream client span for one attempt and puts its
// traceparent on the request to the agent.
func (g *Gateway) startAttempt(ctx context.Context, out *http.Request, be Backend, n int) trace.Span {
	if g.tracer == nil {
		return nil
	}
	ctx, span := g.tracer.Start(ctx, "gateway.upstream", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("macfleet.replica", be.Key), attribute.String("server.address", be.Endpoint),
			attribute.Int("macfleet.attempt", n)))
	tracing.Inject(ctx, out.Header)
	return span
}

// endAttempt ends an attempt's span; a retryable failure says why it is retried.
func endAttempt(span trace.Span, res outcome) {
	if span == nil {
		return
	}
	if f := res.failure; f != nil {
		span.SetAttributes(attribute.String("macfleet.retry.reason", f.reason))
		if f.status != 0 {
			span.SetAttributes(attribute.Int("http.response.status_code", f.status))
		}
		span.SetStatus(codes.Error, f.String())
	} else {
		span.SetAttributes(attribute.Int("http.response.status_code", res.status))
		if res.reason != "" && res.reason != "upstream_status" {
			span.SetStatus(codes.Error, res.reason)
		}
	}
	span.End()
}

// firstByte marks the first byte of the answer on the attempt's span.
func firstByte(span trace.Span, ttft time.Duration) {
	if span != nil {
		span.AddEvent("first_byte", trace.WithAttributes(attribute.String("macfleet.ttft", ttft.String())))
	}
}

// accessLog logs one proxied request at verbosity 2, with its trace id (the client's,
// when the gateway does not trace).
func (g *Gateway) accessLog(r *http.Request, model string, res outcome, start time.Time) {
	if !g.log.V(2).Enabled() {
		return
	}
	g.log.V(2).Info("Request", "method", r.Method, "path", r.URL.Path, "model", model, "status", strconv.Itoa(res.status),
		"reason", res.reason, "duration", time.Since(start).Round(time.Microsecond), "traceID", tracing.LogTraceID(r))
}

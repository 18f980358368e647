// Package tracing sets up OpenTelemetry tracing for the request path — gateway, node
// agent, runner — from the standard OTEL_* environment variables, and carries the W3C
// trace context (the traceparent header) from one to the next.
//
// Tracing is off unless an OTLP endpoint is configured
// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT). Spans are
// exported over OTLP/HTTP with protobuf; the exporter, the batch span processor and the
// sampler read the rest of the standard variables themselves (headers, timeout,
// compression, certificates, OTEL_BSP_*, OTEL_TRACES_SAMPLER). A setting macfleet cannot
// honour is an error at start, never ignored. docs/tracing.md lists the spans.
//
// A runner connects nowhere: its spans wait in memory until its agent drains them and
// exports them with its own settings (NewRelayed, Provider.RunnerRelay; package
// spanrelay).
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
)

// Service names, the resource's service.name of each component.
const (
	ServiceGateway = "macfleet-gateway"
	ServiceAgent   = "macfleet-agent"
	ServiceRunner  = "macfleet-runner"
)

// Options configure New.
type Options struct {
	// Service is the default service.name; OTEL_SERVICE_NAME overrides it unless
	// KeepService is set.
	Service string
	// KeepService ignores OTEL_SERVICE_NAME: the runners' spans are exported from the
	// agent's environment and must not take the agent's name.
	KeepService bool
	// Version is service.version.
	Version string
	// Getenv reads the environment; nil means os.Getenv. The exporter and the SDK read
	// their own settings from the process environment whatever this is.
	Getenv func(string) string
	// Log receives export errors (the SDK otherwise prints them to stderr).
	Log logr.Logger
}

// Provider is a configured tracer provider. A nil *Provider is tracing turned off:
// its Tracer is nil and Shutdown does nothing.
type Provider struct {
	tp *sdktrace.TracerProvider
	// client is the exporter's OTLP client, which also exports the runners' spans;
	// version is the service.version of the runners' resource.
	client  otlptrace.Client
	version string
}

// Enabled reports whether the environment asks for tracing, or why its settings cannot
// be honoured. It is the whole decision of New, apart from building the exporter.
func Enabled(getenv func(string) string) (bool, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "", "otlp":
	case "none":
		return false, nil
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported: macfleet exports traces with otlp (or none turns them off)", exp)
	}
	endpoint := firstSet(getenv, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	if endpoint == "" {
		return false, nil
	}
	if !strings.HasPrefix(endpoint, "http://") && !strings.HasPrefix(endpoint, "https://") {
		return false, fmt.Errorf("the OTLP endpoint %q must be a URL starting with http:// or https:// (for example http://otel-collector:4318)", endpoint)
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		switch p := strings.TrimSpace(getenv(k)); p {
		case "", "http/protobuf":
		default:
			return false, fmt.Errorf("%s=%q is not supported: macfleet exports OTLP over HTTP with protobuf (http/protobuf, port 4318 by convention)", k, p)
		}
	}
	return true, nil
}

func firstSet(getenv func(string) string, keys ...string) string {
	for _, k := range keys {
		if v := strings.TrimSpace(getenv(k)); v != "" {
			return v
		}
	}
	return ""
}

// New builds the tracer provider the environment asks for: nil (no error) when tracing
// is off, an error when its settings cannot be honoured.
func New(ctx context.Context, opts Options) (*Provider, error) {
	on, err := Enabled(opts.Getenv)
	if err != nil || !on {
		return nil, err
	}
	// The client reads the OTEL_EXPORTER_OTLP_* settings; the exporter starts it.
	client := otlptracehttp.NewClient()
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("the OTLP trace exporter: %w", err)
	}
	res, err := newResource(ctx, opts)
	if err != nil {
		return nil, err
	}
	setErrorLog(opts.Log)
	return &Provider{tp: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)),
		client: client, version: opts.Version}, nil
}

// newResource is the resource of opts' service: service.name and .version, the SDK,
// the host and OTEL_RESOURCE_ATTRIBUTES (OTEL_SERVICE_NAME too unless KeepService).
func newResource(ctx context.Context, opts Options) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{attribute.String("service.name", opts.Service)}
	if opts.Version != "" {
		attrs = append(attrs, attribute.String("service.version", opts.Version))
	}
	detectors := []resource.Option{resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv()}
	if opts.KeepService {
		detectors = append(detectors, resource.WithAttributes(attrs[0]))
	}
	res, err := resource.New(ctx, append([]resource.Option{resource.WithAttributes(attrs...)}, detectors...)...)
	if err != nil {
		return nil, fmt.Errorf("the trace resource: %w", err)
	}
	return res, nil
}

// setErrorLog sends the SDK's export errors to log (it otherwise prints them to
// stderr).
func setErrorLog(log logr.Logger) {
	if log.GetSink() != nil {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Error(err, "Tracing failed") }))
	}
}

// RunnerRelay exports the spans of the runners this process starts, which connect
// nowhere themselves: with this provider's OTLP client, under the resource of
// ServiceRunner on this host. Nil when tracing is off.
func (p *Provider) RunnerRelay(ctx context.Context) (*spanrelay.Forwarder, error) {
	if p == nil {
		return nil, nil
	}
	res, err := newResource(ctx, Options{Service: ServiceRunner, KeepService: true, Version: p.version})
	if err != nil {
		return nil, err
	}
	return spanrelay.NewForwarder(p.client, res), nil
}

// NewRelayed is a runner's tracer provider: every span, once ended, is encoded into q
// (no batching: the queue is memory, and the runner makes its spans after a request,
// off the decode loop), for the agent to drain and export. It reads no OTEL_*
// variable and connects nowhere; a span is recorded when the agent's span that called
// the runner was (the agent's sampler decides), and its resource is only
// service.name, since the agent exports it under a resource of its own.
func NewRelayed(q *spanrelay.Queue, opts Options) *Provider {
	setErrorLog(opts.Log)
	exp := otlptrace.NewUnstarted(q)
	return &Provider{tp: sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(exp)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", opts.Service))))}
}

// Tracer returns the named tracer; nil when tracing is off.
func (p *Provider) Tracer(name string) trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tp.Tracer(name)
}

// TracerProvider returns the SDK provider; nil when tracing is off.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil {
		return nil
	}
	return p.tp
}

// Shutdown exports what is buffered and stops the provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.tp.Shutdown(ctx)
}

// propagator is W3C Trace Context: the traceparent and tracestate headers.
var propagator = propagation.TraceContext{}

// Extract returns ctx with the remote span context of h's traceparent, if any.
func Extract(ctx context.Context, h http.Header) context.Context {
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject sets h's traceparent (and tracestate) to ctx's span; with no span in ctx it
// removes any traceparent h carries, so a client's header never names a span that a
// traced hop did not make.
func Inject(ctx context.Context, h http.Header) {
	h.Del("Traceparent")
	h.Del("Tracestate")
	propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// StartServer starts the server span of an HTTP request, the same for the gateway, the
// node agent and the runner: named "<component> METHOD PATH" ("METHOD PATH" without a
// component), continuing the caller's traceparent, with the method and path as
// attributes; the request carries the span's context. A nil t is tracing turned off:
// r comes back unchanged with a nil span, for the caller to skip, and nothing is
// built.
func StartServer(t trace.Tracer, r *http.Request, component string) (*http.Request, trace.Span) {
	if t == nil {
		return r, nil
	}
	name := component + " " + r.Method + " " + r.URL.Path
	if component == "" {
		name = name[1:]
	}
	ctx, span := t.Start(Extract(r.Context(), r.Header), name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
	return r.WithContext(ctx), span
}

// TraceID is the trace id of ctx's span, "" without one: for access logs.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// LogTraceID is the trace id the access log line of r names, shared by the gateway
// and the node agent: r's own span's, or, when this hop does not trace, the one its
// caller's traceparent carries, so that the line is found by its trace either way.
func LogTraceID(r *http.Request) string {
	if id := TraceID(r.Context()); id != "" {
		return id
	}
	return TraceID(Extract(r.Context(), r.Header))
}

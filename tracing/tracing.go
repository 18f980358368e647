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
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
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
	// KeepService ignores OTEL_SERVICE_NAME: the runner inherits the agent's
	// environment and must not take the agent's name.
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
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("the OTLP trace exporter: %w", err)
	}
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
	if opts.Log.GetSink() != nil {
		log := opts.Log
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Error(err, "Tracing failed") }))
	}
	return &Provider{tp: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))}, nil
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

// StartServer starts the server span of an HTTP request named name, continuing the
// caller's traceparent, with the method and path as attributes; the request carries
// the span's context.
func StartServer(t trace.Tracer, r *http.Request, name string) (*http.Request, trace.Span) {
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

// ExportPort is the TCP port spans are exported to when the environment asks for
// tracing, 0 when it does not: what a sandboxed runner may connect to (package
// runner/sandbox). An endpoint without a port uses its scheme's (80 or 443).
func ExportPort(getenv func(string) string) (uint16, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	on, err := Enabled(getenv)
	if err != nil || !on {
		return 0, err
	}
	u, err := url.Parse(firstSet(getenv, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"))
	if err != nil {
		return 0, fmt.Errorf("the OTLP endpoint: %w", err)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("the OTLP endpoint %q has no valid port", u.Redacted())
	}
	return uint16(n), nil
}

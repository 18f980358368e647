package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
	"github.com/macfleet/macfleet/test/support/otlptest"
)

func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    bool
		wantErr string
	}{
		{name: "nothing set: off"},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, want: true},
		{name: "traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/v1/traces"}, want: true},
		{name: "exporter otlp", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, want: true},
		{name: "exporter none wins", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{name: "sdk disabled wins", env: map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{name: "sdk disabled false", env: map[string]string{"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, want: true},
		{name: "http/protobuf", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, want: true},
		{name: "exporter zipkin", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
			wantErr: `OTEL_TRACES_EXPORTER="zipkin" is not supported`},
		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
			wantErr: `OTEL_EXPORTER_OTLP_PROTOCOL="grpc" is not supported`},
		{name: "traces json", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
			wantErr: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/json"`},
		{name: "host without scheme", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
			wantErr: "must be a URL starting with http:// or https://"},
		{name: "protocol without endpoint is off", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Enabled(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Enabled = %v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Enabled = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestNewOffWithoutEndpoint(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	p, err := New(context.Background(), Options{Service: ServiceGateway})
	if err != nil || p != nil {
		t.Fatalf("New = %v, %v; want nil, nil", p, err)
	}
	if p.Tracer("x") != nil || p.TracerProvider() != nil || p.Shutdown(context.Background()) != nil {
		t.Fatal("a nil Provider must give a nil tracer and shut down cleanly")
	}
}

// TestExportToReceiver sends spans through the real OTLP/HTTP exporter to an
// in-process receiver and checks the service name each component reports.
func TestExportToReceiver(t *testing.T) {
	rcv := startReceiver(t)
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Service: ServiceAgent}, "mac-agent-7"},
		{Options{Service: ServiceRunner, KeepService: true}, ServiceRunner},
	} {
		ctx := context.Background()
		p, err := New(ctx, tc.opts)
		if err != nil || p == nil {
			t.Fatalf("New(%+v) = %v, %v", tc.opts, p, err)
		}
		_, span := p.Tracer("test").Start(ctx, "work "+tc.want)
		id := span.SpanContext().TraceID().String()
		span.End()
		if err := p.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		spans, err := rcv.Wait(wctx, id, func(s []otlptest.Span) bool { return len(s) > 0 })
		cancel()
		if err != nil {
			t.Fatalf("no span of trace %s reached the receiver: %v", id, err)
		}
		if s := spans[0]; s.Service != tc.want || s.Name != "work "+tc.want {
			t.Errorf("received %v; want service %q", s, tc.want)
		}
	}
}

// startReceiver starts an OTLP receiver for the test and points the environment's
// exporter at it, with OTEL_SERVICE_NAME set to mac-agent-7.
func startReceiver(t *testing.T) *otlptest.Receiver {
	t.Helper()
	rcv, err := otlptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rcv.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "mac-agent-7")
	return rcv
}

func TestPropagation(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	h := http.Header{}
	h.Set("Traceparent", "00-11111111111111111111111111111111-2222222222222222-01")
	Inject(ctx, h)
	if got, want := h.Get("Traceparent"), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; got != want {
		t.Fatalf("traceparent = %q; want %q", got, want)
	}
	back := trace.SpanContextFromContext(Extract(context.Background(), h))
	if !back.IsRemote() || back.TraceID() != tid || back.SpanID() != sid {
		t.Fatalf("extracted %+v", back)
	}
	if got := TraceID(ctx); got != tid.String() {
		t.Fatalf("TraceID = %q", got)
	}
	// No span: a client's traceparent does not pass through a traced hop.
	Inject(context.Background(), h)
	if got := h.Get("Traceparent"); got != "" {
		t.Fatalf("traceparent = %q; want none", got)
	}
	if got := TraceID(context.Background()); got != "" {
		t.Fatalf("TraceID without a span = %q", got)
	}
}

// TestLogTraceID: an access log names the request's own span's trace, else its
// caller's traceparent's, else none.
func TestLogTraceID(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	own := trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	const callers = "00-11111111111111111111111111111111-2222222222222222-01"
	for _, tc := range []struct {
		name        string
		ctx         context.Context
		traceparent string
		want        string
	}{
		{name: "own span", ctx: own, traceparent: callers, want: tid.String()},
		{name: "caller's traceparent", ctx: context.Background(), traceparent: callers, want: "11111111111111111111111111111111"},
		{name: "neither", ctx: context.Background()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequestWithContext(tc.ctx, http.MethodPost, "/v1/chat/completions", nil)
			if tc.traceparent != "" {
				r.Header.Set("Traceparent", tc.traceparent)
			}
			if got := LogTraceID(r); got != tc.want {
				t.Errorf("LogTraceID = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRunnerRelay: a runner's span, made under the agent's traceparent and queued in
// memory (NewRelayed), reaches the receiver once the agent drains the runner over HTTP
// (RunnerRelay): same trace, span and parent ids, the runner's service name under the
// agent's resource, whatever resource the runner claimed.
func TestRunnerRelay(t *testing.T) {
	rcv := startReceiver(t)
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=relay-test")
	ctx := context.Background()
	agent, err := New(ctx, Options{Service: ServiceAgent, Version: "v9"})
	if err != nil || agent == nil {
		t.Fatalf("New = %v, %v", agent, err)
	}
	defer agent.Shutdown(ctx)
	relay, err := agent.RunnerRelay(ctx)
	if err != nil || relay == nil {
		t.Fatalf("RunnerRelay = %v, %v", relay, err)
	}

	// The runner: its queue behind a real HTTP server; it claims to be the gateway.
	q := spanrelay.NewQueue(0)
	runner := NewRelayed(q, Options{Service: ServiceGateway})
	srv := httptest.NewServer(q)
	defer srv.Close()

	actx, call := agent.Tracer("agent").Start(ctx, "agent.runner", trace.WithSpanKind(trace.SpanKindClient))
	h := http.Header{}
	Inject(actx, h)
	req, _ := http.NewRequestWithContext(Extract(ctx, h), http.MethodPost, "http://runner/v1/chat/completions", nil)
	_, server := StartServer(runner.Tracer("runner"), req, "runner")
	server.End()
	call.End()
	if err := runner.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	got, err := relay.Relay(ctx, srv.Client(), srv.URL)
	if err != nil || got.Spans != 1 || got.Dropped != 0 {
		t.Fatalf("Relay = %+v, %v; want 1 span, none dropped", got, err)
	}
	// A second drain finds the queue empty.
	if again, err := relay.Relay(ctx, srv.Client(), srv.URL); err != nil || again.Spans != 0 {
		t.Fatalf("a second Relay = %+v, %v; want nothing", again, err)
	}
	traceID := call.SpanContext().TraceID().String()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	spans, err := rcv.Wait(wctx, traceID, func(s []otlptest.Span) bool {
		for _, sp := range s {
			if sp.Name == "runner POST /v1/chat/completions" {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("the runner's span did not reach the receiver: %v", err)
	}
	for _, s := range spans {
		if s.Name != "runner POST /v1/chat/completions" {
			continue
		}
		if s.SpanID != server.SpanContext().SpanID().String() || s.ParentID != call.SpanContext().SpanID().String() || s.Kind != "SERVER" {
			t.Errorf("relayed span %v; want span %s under the agent's %s", s, server.SpanContext().SpanID(), call.SpanContext().SpanID())
		}
		host, _ := os.Hostname()
		for k, want := range map[string]string{"service.name": ServiceRunner, "service.version": "v9",
			"deployment.environment": "relay-test", "host.name": host} {
			if s.Resource[k] != want {
				t.Errorf("relayed span's resource %s = %q; want %q (resource %v)", k, s.Resource[k], want, s.Resource)
			}
		}
	}
}

// TestRunnerRelayOff: without tracing there is nothing to relay.
func TestRunnerRelayOff(t *testing.T) {
	var p *Provider
	if f, err := p.RunnerRelay(context.Background()); f != nil || err != nil {
		t.Fatalf("RunnerRelay of tracing off = %v, %v; want nil, nil", f, err)
	}
}

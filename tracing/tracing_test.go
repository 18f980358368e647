package tracing

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/internal/otlptest"
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
	rcv, err := otlptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "mac-agent-7")
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

func TestExportPort(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		want    uint16
		wantErr string
	}{
		{map[string]string{}, 0, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, 4318, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://b:4319/v1/traces"}, 4319, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector"}, 443, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector"}, 80, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, 0, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:0"}, 0, "has no valid port"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, 0, "must be a URL"},
	} {
		got, err := ExportPort(func(k string) string { return tc.env[k] })
		if got != tc.want || (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ExportPort(%v) = %d, %v; want %d, %q", tc.env, got, err, tc.want, tc.wantErr)
		}
	}
}

package gateway

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestTraceSpans: a request whose first attempt gets a 503 and whose second is served
// is one server span continuing the client's trace, with an upstream span per attempt
// (the first saying why it was retried), each the parent of the traceparent its agent
// received in place of the client's.
func TestTraceSpans(t *testing.T) {
	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var calls atomic.Int32
	var mu sync.Mutex
	var received []string // the traceparent of each call, in order
	agent := func(_ int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received = append(received, r.Header.Get("Traceparent"))
		mu.Unlock()
		if calls.Add(1) == 1 {
			status(http.StatusServiceUnavailable, "")(0, w, r)
			return
		}
		okJSON(w, r)
	}
	a, b := newUpstream(t, agent), newUpstream(t, agent)
	g := newTestGateway(t, Options{TracerProvider: tp})
	g.serveReplicas(a.host(), b.host())
	resp, body := post(t, g.url, chatBody, "Traceparent", "00-"+traceID+"-"+clientSpan+"-01")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}

	// The client has the answer a moment before the handler ends its spans.
	var server sdktrace.ReadOnlySpan
	var attempts []sdktrace.ReadOnlySpan
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() (bool, string) {
		spans := rec.Ended()
		server, attempts = nil, nil
		for _, s := range spans {
			switch s.Name() {
			case "POST /v1/chat/completions":
				server = s
			case "gateway.upstream":
				attempts = append(attempts, s)
			}
		}
		return server != nil && len(attempts) == 2,
			fmt.Sprintf("want a server span and 2 upstream spans, got %d spans: %v", len(spans), names(spans))
	})
	if server.SpanContext().TraceID().String() != traceID || server.Parent().SpanID().String() != clientSpan || !server.Parent().IsRemote() {
		t.Errorf("the server span %v has parent %v; want the client's span %s of trace %s", server.SpanContext(), server.Parent(), clientSpan, traceID)
	}
	if got := attr(server, "http.response.status_code"); got != "200" {
		t.Errorf("the server span's status code is %q", got)
	}
	for i, s := range attempts {
		if s.Parent().SpanID() != server.SpanContext().SpanID() {
			t.Errorf("attempt %d is not a child of the server span", i+1)
		}
		if got, want := attr(s, "macfleet.attempt"), []string{"1", "2"}[i]; got != want {
			t.Errorf("attempt %d is numbered %s", i+1, got)
		}
		want := "00-" + traceID + "-" + s.SpanContext().SpanID().String() + "-01"
		if received[i] != want {
			t.Errorf("call %d carried traceparent %q; want its attempt's %q", i+1, received[i], want)
		}
	}
	if got := attr(attempts[0], "macfleet.retry.reason"); got != "status_503" || attempts[0].Status().Code != codes.Error {
		t.Errorf("the failed attempt says retry reason %q, status %v", got, attempts[0].Status())
	}
	if got := attr(attempts[1], "macfleet.retry.reason"); got != "" || attempts[1].Status().Code == codes.Error {
		t.Errorf("the served attempt says retry reason %q, status %v", got, attempts[1].Status())
	}
}

// TestTraceHoldSpan: a request that waits for a busy replica has a gateway.hold span
// saying it queued, ended when it was granted the replica.
func TestTraceHoldSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	release := make(chan struct{})
	first := make(chan struct{})
	up := newUpstream(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			close(first)
			<-release
		}
		okJSON(w, r)
	})
	g := newTestGateway(t, Options{TracerProvider: tp})
	g.serveReplicas(up.host()) // one slot: the second request waits for the first
	done := make(chan int, 2)
	go func() { resp, _ := post(t, g.url, chatBody); done <- resp.StatusCode }()
	<-first
	go func() { resp, _ := post(t, g.url, chatBody); done <- resp.StatusCode }()
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		n, _ := g.adm.Queued("a/m")
		return n == 1, fmt.Sprintf("%d requests queued; want the second one", n)
	})
	close(release)
	for range 2 {
		if code := <-done; code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
	}
	var holds []sdktrace.ReadOnlySpan
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() (bool, string) {
		holds = nil
		servers := 0
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "gateway.hold":
				holds = append(holds, s)
			case "POST /v1/chat/completions":
				servers++
			}
		}
		return servers == 2, fmt.Sprintf("want both requests' spans ended, got %v", names(rec.Ended()))
	})
	if len(holds) != 1 {
		t.Fatalf("want one hold span, got %v", names(rec.Ended()))
	}
	if r, o := attr(holds[0], "macfleet.hold.reason"), attr(holds[0], "macfleet.hold.outcome"); r != "queue" || o != "granted" {
		t.Errorf("the hold span says reason %q, outcome %q", r, o)
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

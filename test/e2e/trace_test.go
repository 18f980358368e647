package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/internal/tracing"
	"github.com/macfleet/macfleet/test/support/otlptest"
	"github.com/macfleet/macfleet/test/support/syncbuf"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestTraceThroughGatewayAgentRunner: with the standard OTEL_* variables pointing at an
// OTLP receiver in this test, one streamed chat through a gateway, a Mac's agent and
// its runner is one trace that continues the client's traceparent, with each
// component's spans under the one that called it and the runner's stages below its
// request; the gateway's and the agent's access logs carry the trace id.
func TestTraceThroughGatewayAgentRunner(t *testing.T) {
	rcv, err := otlptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	otelEnv := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.URL, "OTEL_BSP_SCHEDULE_DELAY=100"}

	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "traced", 1))
	replica := waitReady(t, ns, "traced", 1, 3*time.Minute)[0]
	node, key := replica.Spec.NodeName, replica.Namespace+"/"+replica.Name

	// The Mac's agent restarts with tracing on (it exports its runners' spans too)
	// and logging requests; at the end it restarts as it was.
	if err := fleet.StopAgent(node, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := fleet.StartAgentWith(node, otelEnv, []string{"--zap-log-level=2"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fleet.StopAgent(node, time.Minute); err != nil {
			t.Error(err)
		}
		if err := fleet.StartAgent(node); err != nil {
			t.Fatal(err)
		}
		if err := fleet.WaitNodeReady(context.Background(), node); err != nil {
			t.Error(err)
		}
	})

	// The restarted agent loads the Resident model again; the traced request comes
	// once it is Ready, so that its lease is a warm one.
	addr := fleet.Agent(node).Addr
	testenv.Eventually(t, 2*time.Minute, 100*time.Millisecond, func() (bool, string) {
		st, err := agentStatusErr(t.Context(), addr)
		if err != nil {
			return false, err.Error()
		}
		models, _ := st["models"].([]any)
		for _, m := range models {
			if mm, _ := m.(map[string]any); mm["name"] == key && mm["state"] == "Ready" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("the restarted agent's models: %v", models)
	})

	// A gateway in this process, its tracer built from the same variables.
	for _, kv := range otelEnv {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	tp, err := tracing.New(t.Context(), tracing.Options{Service: tracing.ServiceGateway})
	if err != nil || tp == nil {
		t.Fatalf("tracing.New = %v, %v", tp, err)
	}
	defer tp.Shutdown(context.Background())
	var gwLog syncbuf.Buffer
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(&gwLog, prefix, args) }, funcr.Options{Verbosity: 2})
	url, _ := inProcessGateway(t, gateway.Config{TracerProvider: tp.TracerProvider()}, log)

	// The client's own trace: 4bf9... is its trace id, 00f0... the span it calls from.
	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithHeader("traceparent", "00-"+traceID+"-"+clientSpan+"-01"))
	// Until the restarted agent has its replica loaded again, the gateway answers 503.
	var lastErr error
	testenv.Eventually(t, 2*time.Minute, 200*time.Millisecond, func() (bool, string) {
		_, lastErr = chat(t.Context(), c, ns+"/traced", true)
		return lastErr == nil, fmt.Sprintf("a streamed chat through the traced gateway: %v", lastErr)
	})

	// Each process exports on its own schedule: the trace is whole once every span of
	// the successful request is in.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	spans, err := rcv.Wait(ctx, traceID, func(ss []otlptest.Span) bool {
		missing := map[string]bool{"POST /v1/chat/completions": true, "agent POST /v1/chat/completions": true,
			"agent.runner": true, "runner POST /v1/chat/completions": true, "runner.decode": true}
		for _, s := range ss {
			if code, ok := s.Attrs["http.response.status_code"]; ok && code != "200" ||
				s.Name == "runner.decode" && s.Attrs["macfleet.completion_tokens"] != "8" {
				continue
			}
			delete(missing, s.Name)
		}
		return len(missing) == 0
	})
	if err != nil {
		t.Fatalf("the trace is incomplete: %v\n%s", err, describeSpans(spans))
	}
	checkTrace(t, spans, clientSpan)

	if !strings.Contains(gwLog.String(), `"traceID"="`+traceID+`"`) {
		t.Errorf("the gateway's access log has no line with trace id %s:\n%s", traceID, gwLog.String())
	}
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		return strings.Contains(fleet.AgentLog(node), `"traceID":"`+traceID+`"`), "the agent's access log has the trace id"
	})
}

// checkTrace finds, from the client's span down, the successful attempt's chain of
// spans and checks each one's service, kind, parent and what it records.
func checkTrace(t *testing.T, spans []otlptest.Span, clientSpan string) {
	t.Helper()
	byID := map[string]otlptest.Span{}
	children := map[string][]otlptest.Span{}
	for _, s := range spans {
		byID[s.SpanID] = s
		children[s.ParentID] = append(children[s.ParentID], s)
	}
	fail := func(format string, args ...any) {
		t.Fatalf(format+"\nthe trace:\n%s", append(args, describeSpans(spans))...)
	}
	// one returns the child of parent named name (the last one: the successful attempt).
	one := func(parent otlptest.Span, name, service, kind string) otlptest.Span {
		var found *otlptest.Span
		for _, c := range children[parent.SpanID] {
			if c.Name == name {
				found = &c
			}
		}
		if found == nil {
			fail("no span %q under %v", name, parent)
		}
		if found.Service != service || found.Kind != kind {
			fail("span %v: want service %s, kind %s", *found, service, kind)
		}
		// A span starts within its parent. In the same process it also ends within it;
		// a server span in another process may end after its client's span, since the
		// server finishes its handler (metrics, releasing the slot) after the client has
		// read the last byte.
		if found.Start.Before(parent.Start) || found.Start.After(parent.End) ||
			found.Service == parent.Service && found.End.After(parent.End.Add(time.Millisecond)) {
			fail("span %v is not within its parent %v", *found, parent)
		}
		return *found
	}
	root := otlptest.Span{SpanID: clientSpan, Start: time.Unix(0, 0), End: time.Now().Add(time.Hour)}
	gw := one(root, "POST /v1/chat/completions", tracing.ServiceGateway, "SERVER")
	if gw.Attrs["http.response.status_code"] != "200" || !strings.HasSuffix(gw.Attrs["macfleet.deployment"], "/traced") {
		fail("the gateway's span %v has attributes %v", gw, gw.Attrs)
	}
	up := one(gw, "gateway.upstream", tracing.ServiceGateway, "CLIENT")
	agent := one(up, "agent POST /v1/chat/completions", tracing.ServiceAgent, "SERVER")
	lease := one(agent, "agent.lease", tracing.ServiceAgent, "INTERNAL")
	if lease.Attrs["macfleet.cold_start"] != "false" {
		fail("the lease of a loaded model says cold_start=%q", lease.Attrs["macfleet.cold_start"])
	}
	guard := one(agent, "agent.prefill_guard", tracing.ServiceAgent, "INTERNAL")
	call := one(agent, "agent.runner", tracing.ServiceAgent, "CLIENT")
	if guard.End.After(call.Start) {
		fail("the prefill guard %v ends after the runner call %v starts", guard, call)
	}
	runner := one(call, "runner POST /v1/chat/completions", tracing.ServiceRunner, "SERVER")
	one(runner, "runner.prompt_cache", tracing.ServiceRunner, "INTERNAL")
	queue := one(runner, "runner.queue", tracing.ServiceRunner, "INTERNAL")
	prefill := one(runner, "runner.prefill", tracing.ServiceRunner, "INTERNAL")
	decode := one(runner, "runner.decode", tracing.ServiceRunner, "INTERNAL")
	if prefill.Attrs["macfleet.prompt_tokens"] != guard.Attrs["macfleet.prompt_tokens"] {
		fail("the runner prefilled %s prompt tokens, the agent's guard counted %s",
			prefill.Attrs["macfleet.prompt_tokens"], guard.Attrs["macfleet.prompt_tokens"])
	}
	if queue.End.After(prefill.Start) || prefill.End.After(decode.Start) {
		fail("the runner's stages overlap: %v, %v, %v", queue, prefill, decode)
	}
}

func describeSpans(spans []otlptest.Span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %v %v\n", s, s.Attrs)
	}
	return b.String()
}

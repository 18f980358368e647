package engine

import (
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/tracing"
	"github.com/macfleet/macfleet/test/support/otlptest"
)

// BenchmarkTracedVsUntracedRunner compares the decode rate of a sandboxed runner whose
// agent traces (the runner records its spans for every request, keeps them in memory,
// and its agent drains and exports them every 5 s, since these requests bypass it:
// internal/tracing/spanrelay) with one whose agent does not, in the same run: two
// `macfleet serve` agents, the first with
// OTEL_EXPORTER_OTLP_ENDPOINT pointing at an OTLP receiver in this process, each with
// a runner of the mid model; streamed greedy chat completions straight to each
// runner's socket, the traced one's with a sampled traceparent, in pairs that run at
// the same time after a warm-up (as in BenchmarkSandboxedVsUnconfined). Metrics:
//
//	traced-tok/s, untraced-tok/s   median decode rate
//	tok/s-ratio                    median over the pairs of traced / untraced (target ≥ 0.98)
//	cpu-ratio                      the traced runner's CPU time per token / the untraced one's (Linux)
//	spans/request                  runner spans the receiver got per traced request
func BenchmarkTracedVsUntracedRunner(b *testing.B) {
	const pairs = 20
	rcv, err := otlptest.Start()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rcv.Close)
	on := startAgentEnv(b, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.URL}, []string{"--runner-sandbox", "on"},
		served{name: modelMid, ctx: 1024})
	off := startAgentEnv(b, []string{"OTEL_SDK_DISABLED=true"}, []string{"--runner-sandbox", "on"}, served{name: modelMid, ctx: 1024})
	traced, untraced := on.direct(modelMid), off.direct(modelMid)
	traced.traced = true
	traced.mustChat(b, modelMid, prompt, genTokens, nil)
	untraced.mustChat(b, modelMid, prompt, genTokens, nil)

	var p pairedDecode
	cpu := startCPU(on.cmd.Process.Pid)
	for b.Loop() {
		p.run(b, pairs, traced, untraced, on.model(modelMid).PID, off.model(modelMid).PID)
	}
	requests := len(p.ratios) + 1 // and the warm-up
	// The traced runner's spans reached the receiver through its agent: the
	// comparison is of a runner that traced.
	var decodes, runnerSpans int
	on.poll(30*time.Second, "the traced runner's runner.decode spans reach the receiver", func() bool {
		decodes, runnerSpans = 0, 0
		for _, s := range rcv.Spans("") {
			if s.Service == tracing.ServiceRunner {
				runnerSpans++
			}
			if s.Name == "runner.decode" {
				decodes++
			}
		}
		return decodes == requests
	})
	summary := p.report(b, cpu, "traced", "untraced")
	b.ReportMetric(float64(runnerSpans)/float64(requests), "spans/request")
	b.Logf("traced vs untraced sandboxed runner, mid model: %s; %d runner.decode spans relayed for %d traced requests",
		summary, decodes, requests)
}

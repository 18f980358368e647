package runnerproc

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/tracing"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
	"github.com/macfleet/macfleet/test/support/otlptest"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// TestAttackTracingRunnerReachesTheNetwork: with tracing on in the agent's environment,
// a runner with a loader bug (the fake runner's --fake-dial and --fake-dial-unix,
// started through the agent's ProcessFactory as the agent starts it) connects to the
// collector's TCP port and to another runner's unix socket, and reads the collector's
// address and credential from its environment; it must now get "permission denied"
// for both connects and no OTEL_* variable, while a real confined runner's spans
// still reach the collector, through the agent.
func TestAttackTracingRunnerReachesTheNetwork(t *testing.T) {
	if st := sandbox.Probe(); !st.Enforced {
		t.Skipf("no runner sandbox on this kernel: %s", st.Detail)
	}
	collector, err := otlptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer collector.Close()
	const collectorSecret = "COLLECTOR-KEY-71be"
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-key="+collectorSecret)
	// The agent's tracing, as cmd/macfleet builds it.
	tp, err := tracing.New(t.Context(), tracing.Options{Service: tracing.ServiceAgent})
	if err != nil || tp == nil {
		t.Fatalf("tracing.New = %v, %v", tp, err)
	}
	defer tp.Shutdown(context.Background())
	relay, err := tp.RunnerRelay(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	// Another runner's socket, in a directory of its own.
	other := filepath.Join(t.TempDir(), "r.sock")
	uln, err := net.Listen("unix", other)
	if err != nil {
		t.Fatal(err)
	}
	defer uln.Close()
	collectorAddr := strings.TrimPrefix(collector.URL, "http://")

	t.Run("fake runner connects out", func(t *testing.T) {
		model := filepath.Join(t.TempDir(), "m.gguf")
		if err := os.WriteFile(model, []byte("GGUF"), 0o600); err != nil {
			t.Fatal(err)
		}
		f := NewProcessFactory(ProcessConfig{RunnerPath: procBuildFakeRunner(t), SpanRelay: relay,
			Args: []string{"--fake-dial", collectorAddr, "--fake-dial-unix", other, "--fake-fail-linger", "1m"}})
		r := procStart(t, f, enginepool.ModelSpec{Name: "m", Path: model}, 0)
		checkEnviron(t, r.PID(), "OTEL_", collectorSecret)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		err := r.WaitReady(ctx)
		if err == nil {
			t.Fatal("WaitReady: the probing runner reported a successful load")
		}
		t.Logf("the probing runner's load error: %v", err)
		for _, target := range []string{collectorAddr, other} {
			if got := dialOutcome(err.Error(), target); !strings.Contains(got, "permission denied") {
				t.Errorf("the runner's connect to %s: %q; want permission denied\n%s", target, got, err)
			}
		}
	})

	// A real runner, confined the same way, is traced: its spans reach the collector
	// under the caller's span, drained and exported by the agent.
	t.Run("real runner's spans relayed", func(t *testing.T) {
		model := filepath.Join(t.TempDir(), "tiny.gguf")
		if err := ggufsynth.Write(model, ggufsynth.Tiny()); err != nil {
			t.Fatal(err)
		}
		var out syncbuf.Buffer
		f := NewProcessFactory(ProcessConfig{RunnerPath: realRunner(t), Threads: 1, Output: &out, SpanRelay: relay})
		r := procStart(t, f, enginepool.ModelSpec{Name: "tiny", Path: model, Engine: engine.Settings{ContextLength: 256, Parallel: 1}}, 0)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := r.WaitReady(ctx); err != nil {
			t.Fatalf("WaitReady: %v\n%s", err, out.String())
		}
		checkEnviron(t, r.PID(), "OTEL_", collectorSecret)
		const traceID, caller = "5cf92f3577b34da6a3ce929d0e0e4736", "10f067aa0ba902b7"
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.BaseURL()+"/v1/completions",
			strings.NewReader(`{"prompt":"hello","max_tokens":4}`))
		req.Header.Set("Traceparent", "00-"+traceID+"-"+caller+"-01")
		resp, err := r.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %s", resp.Status)
		}
		// The agent drains the runner once the answer is read, not only every
		// spanRelayPeriod.
		wctx, cancel := context.WithTimeout(ctx, spanRelayPeriod-time.Second)
		defer cancel()
		spans, err := collector.Wait(wctx, traceID, func(ss []otlptest.Span) bool {
			seen := map[string]bool{}
			for _, s := range ss {
				seen[s.Name] = true
			}
			return seen["runner.decode"] && seen["runner POST /v1/completions"]
		})
		if err != nil {
			t.Fatalf("the runner's spans did not reach the collector within %s of the answer: %v\n%s", spanRelayPeriod-time.Second, err, out.String())
		}
		server := map[string]bool{}
		for _, s := range spans {
			if s.Service != tracing.ServiceRunner {
				t.Errorf("span %v: want service %s", s, tracing.ServiceRunner)
			}
			if s.Name == "runner POST /v1/completions" {
				server[s.SpanID] = true
				if s.ParentID != caller {
					t.Errorf("the runner's server span %v: want parent %s", s, caller)
				}
			}
		}
		for _, s := range spans {
			if s.Name == "runner.decode" && !server[s.ParentID] {
				t.Errorf("runner.decode %v is not under the runner's server span", s)
			}
		}
	})
}

// dialOutcome is what the fake runner's probe reported for its connect to target.
func dialOutcome(loadErr, target string) string {
	_, rest, ok := strings.Cut(loadErr, "dial "+target+": ")
	if !ok {
		return "(no connect reported)"
	}
	outcome, _, _ := strings.Cut(rest, ";")
	return outcome
}

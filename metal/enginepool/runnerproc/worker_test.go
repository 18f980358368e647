package runnerproc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/macfleet/macfleet/agent/splitlink"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// TestSplitWorkerUnderThePool: a worker shard (ModelSpec.SplitWorker) is a real
// `macfleet-runner worker` process started by the pool: it listens on loopback only,
// its reservation counts in the pool's committed memory, a real runner split across
// it loads through it — the worker answering the shard's reservation as its memory —,
// the pool measures its footprint (which holds the shard's layers once the runner
// loaded), and unloading it stops the process and reports what it held.
func TestSplitWorkerUnderThePool(t *testing.T) {
	bin := os.Getenv(RunnerEnv)
	if bin == "" {
		t.Skipf("%s is unset: build the runner with `make runner` and point %s at bin/macfleet-runner (`make test` does both)", RunnerEnv, RunnerEnv)
	}
	model := filepath.Join(t.TempDir(), "small.gguf")
	if err := ggufsynth.Write(model, ggufsynth.Small()); err != nil {
		t.Fatal(err)
	}
	gauge, err := enginepool.NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	f := NewProcessFactory(ProcessConfig{RunnerPath: bin, Threads: 1})
	p, err := enginepool.New(enginepool.Config{CeilingBytes: 8 << 30, AgentPID: -1, PollActive: 50 * time.Millisecond}, f, gauge, nil, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	go func() { _ = p.Run(ctx) }()
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	const reserved = 256 << 20
	if err := p.Register(enginepool.ModelSpec{Name: "shard", Path: model, Residency: enginepool.Pinned, SplitWorker: true,
		Engine: engine.Settings{ContextLength: 512, Parallel: 1}, EstimatedBytes: reserved}); err != nil {
		t.Fatal(err)
	}
	if err := p.Load(ctx, "shard"); err != nil {
		t.Fatal(err)
	}
	r, err := p.RunnerOf("shard")
	if err != nil {
		t.Fatal(err)
	}
	w, ok := r.(*WorkerRunner)
	if !ok {
		t.Fatalf("the shard's runner is a %T, want a *WorkerRunner", r)
	}
	if host, _, _ := net.SplitHostPort(w.Addr()); host != "127.0.0.1" {
		t.Errorf("the worker listens on %s, want loopback only", w.Addr())
	}
	if snap := p.Snapshot(); snap.CommittedBytes < reserved {
		t.Errorf("committed %d bytes with the worker loaded, want its reservation %d counted", snap.CommittedBytes, reserved)
	}

	// Only a connection that opens with its secret reaches it (the agent's split link
	// sends it): a real runner split across it (2 + 2 layers) loads through a forward
	// that does, and that itself requires the link's token, which the runner reads on
	// its standard input (--split-tokens-stdin, as launch gives it).
	if len(w.Secret()) != runnerapi.SplitSecretBytes {
		t.Fatalf("the worker's secret is %d bytes, want %d", len(w.Secret()), runnerapi.SplitSecretBytes)
	}
	fwd, err := splitlink.ForwardWithToken(func(ctx context.Context) (net.Conn, error) {
		return splitlink.DialWorker(ctx, splitlink.Worker{Addr: w.Addr(), Secret: w.Secret()}, 5*time.Second)
	}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	links := []enginepool.SplitWorker{{Addr: fwd.Addr(), Layers: 2, Token: fwd.Token()}}
	head := exec.CommandContext(ctx, bin, append([]string{"--model", model, "--addr", "127.0.0.1:0", "--threads", "1", "--ctx", "512"},
		splitArgs(links)...)...)
	head.Stdin = splitTokensInput(links)
	stdout, err := head.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	head.Stderr = &stderr
	if err := head.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = head.Process.Kill(); _ = head.Wait() })
	addr := listeningAddr(t, stdout, &stderr)
	procWaitFor(t, time.Minute, "the split runner to be ready", func() bool {
		resp, err := http.Get("http://" + addr + "/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var h health
		_ = json.NewDecoder(resp.Body).Decode(&h)
		if h.Status == "failed" {
			t.Fatalf("the split runner failed: %s\n%s", h.Error, stderr.String())
		}
		return h.Status == "ready"
	})
	var st runnerapi.Status
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("the split runner's /status: %v", err)
	}
	if len(st.Split) != 1 || st.Split[0].MemoryBytes != reserved {
		t.Errorf("the split runner's workers %+v: want one answering the shard's %d bytes reserved as its memory", st.Split, reserved)
	}
	var resident int64
	procWaitFor(t, 10*time.Second, "the pool to measure the worker holding its layers", func() bool {
		for _, m := range p.Snapshot().Models {
			if m.Name == "shard" {
				resident = m.ResidentBytes
			}
		}
		return resident > 8<<20
	})

	report, err := p.Unload(ctx, "shard")
	if err != nil || report == nil {
		t.Fatalf("Unload = %+v, %v", report, err)
	}
	if report.ResidentBytes <= 0 {
		t.Errorf("unload report %+v: want the worker's resident bytes", report)
	}
	procWaitClosed(t, w.Exited(), 10*time.Second, "the worker to exit")
	// SIGTERM, never an HTTP shutdown (it has none) nor SIGKILL: a worker serving a
	// runner ends that session on SIGTERM and exits.
	if by := w.StoppedBy(); by != StopTerm {
		t.Errorf("the worker was stopped by %q, want SIGTERM (it has no HTTP API to ask, and exits on SIGTERM while serving)", by)
	}
	t.Logf("worker: resident %d MB when measured, %d MB at unload, freed %d MB (%s)", resident>>20,
		report.ResidentBytes>>20, report.FreedBytes>>20, report.Outcome)
}

// listeningAddr reads a runner's listening line from its stdout.
func listeningAddr(t *testing.T, stdout interface{ Read([]byte) (int, error) }, stderr fmt.Stringer) string {
	t.Helper()
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev listenEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event == "listening" {
				found <- ev.Addr
			}
		}
	}()
	select {
	case a := <-found:
		return a
	case <-time.After(time.Minute):
		t.Fatalf("the runner printed no listening line within a minute:\n%s", stderr)
		return ""
	}
}

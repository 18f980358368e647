package runnerproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// WorkerRunner is a `macfleet-runner worker` process holding a worker shard of a
// replica split across Macs (enginepool.ModelSpec.SplitWorker). It is a runner process
// to the pool — started, measured, stopped and reaped the same way — but it speaks
// the worker protocol on a loopback TCP address (Addr), not HTTP: it is ready once
// listening (it opens the model when the head's runner connects), and the runner
// control calls do nothing.
type WorkerRunner struct {
	*ProcessRunner
	// secret is what every connection to the worker must open with (Secret).
	secret []byte
}

var _ enginepool.Runner = (*WorkerRunner)(nil)

// workerArgs is the worker's command line: loopback only (the agent's split link
// carries the head's Mac to it, and authenticates it to the worker: workerSecret); the
// shard's reservation is the memory it answers the head's runner as its own.
func (f *ProcessFactory) workerArgs(spec enginepool.ModelSpec) []string {
	threads := spec.Engine.WithRunnerThreads(f.cfg.Threads, f.cfg.PerformanceCores, spec.WeightBytes).Threads
	args := []string{"worker", "--listen", "127.0.0.1:0", "--model", spec.Path, "--secret-stdin"}
	if threads > 0 {
		args = append(args, "--threads", strconv.Itoa(int(threads)))
	}
	if spec.EstimatedBytes > 0 {
		args = append(args, "--memory", strconv.FormatInt(spec.EstimatedBytes, 10))
	}
	if spec.SplitNext != "" {
		args = append(args, "--next", spec.SplitNext)
	}
	return args
}

// startWorker launches a worker (never adopted or detached: a worker outliving its
// agent would hold memory no agent accounts for) and waits for its listening line.
func (f *ProcessFactory) startWorker(ctx context.Context, path string, spec enginepool.ModelSpec, log logr.Logger) (enginepool.Runner, error) {
	secret, err := workerSecret()
	if err != nil {
		return nil, startError(spec.Name, err)
	}
	r, _, err := f.launch(ctx, path, spec, 0, launchOptions{secret: secret}, log)
	if err != nil {
		return nil, err
	}
	r.worker = true
	return &WorkerRunner{ProcessRunner: r, secret: secret}, nil
}

// Addr is the loopback address the worker serves the head's runner on.
func (w *WorkerRunner) Addr() string { return w.dialAddress }

// Secret is what every connection to Addr must open with (runnerapi.SplitAuthFrame):
// any other process of this Mac that reaches the loopback port is refused.
func (w *WorkerRunner) Secret() []byte { return w.secret }

// workerSecret makes a new worker's secret.
func workerSecret() ([]byte, error) {
	secret := make([]byte, runnerapi.SplitSecretBytes)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("making the split worker's secret: %w", err)
	}
	return secret, nil
}

// secretInput is the worker's standard input: its secret (--secret-stdin), out of its
// command line and environment.
func secretInput(secret []byte) io.Reader {
	return strings.NewReader(hex.EncodeToString(secret) + "\n")
}

// WaitReady returns once the worker listens — already true when Start returned —
// unless it has exited.
func (w *WorkerRunner) WaitReady(ctx context.Context) error {
	select {
	case <-w.exited:
		return w.loadExitError()
	default:
		return nil
	}
}

// Status reports nothing: a worker has no prompt cache or slots.
func (w *WorkerRunner) Status(context.Context) (enginepool.RunnerStatus, error) {
	return enginepool.RunnerStatus{}, nil
}

// SetLimits does nothing: the worker's footprint is bounded by its reservation at
// the head's load, and the enforcer measures it from outside.
func (w *WorkerRunner) SetLimits(context.Context, enginepool.Limits) error { return nil }

// Abort ends nothing: the worker serves no generation of its own.
func (w *WorkerRunner) Abort(context.Context) (int, error) { return 0, nil }

// ClearCache clears nothing.
func (w *WorkerRunner) ClearCache(context.Context) (enginepool.CacheClearResult, error) {
	return enginepool.CacheClearResult{}, nil
}

// SetCacheBudget sets nothing.
func (w *WorkerRunner) SetCacheBudget(context.Context, runnerapi.CacheBudget) (runnerapi.CacheBudgetResult, error) {
	return runnerapi.CacheBudgetResult{}, nil
}

// splitArgs are a split head's --split-worker and --split-layers pairs, in layer order.
func splitArgs(workers []enginepool.SplitWorker) []string {
	var args []string
	for _, w := range workers {
		args = append(args, "--split-worker", w.Addr, "--split-layers", strconv.Itoa(w.Layers))
	}
	if splitTokensInput(workers) != nil {
		args = append(args, "--split-tokens-stdin")
	}
	return args
}

// splitTokensInput is a split head's standard input: its workers' link tokens
// (--split-tokens-stdin), one line each; nil when they have none.
func splitTokensInput(workers []enginepool.SplitWorker) io.Reader {
	var b strings.Builder
	for _, w := range workers {
		if w.Token == nil {
			return nil
		}
		b.WriteString(hex.EncodeToString(w.Token) + "\n")
	}
	if b.Len() == 0 {
		return nil
	}
	return strings.NewReader(b.String())
}

// splitPorts are the loopback ports its sandbox lets a process connect to: a split
// head's workers, or a split worker's next worker shard (nil for any other runner).
func splitPorts(spec enginepool.ModelSpec) []uint16 {
	addrs := []string{}
	for _, w := range spec.SplitWorkers {
		addrs = append(addrs, w.Addr)
	}
	if spec.SplitWorker && spec.SplitNext != "" {
		addrs = append(addrs, spec.SplitNext)
	}
	var ports []uint16
	for _, a := range addrs {
		if ap, err := netip.ParseAddrPort(a); err == nil && ap.Addr().IsLoopback() {
			ports = append(ports, ap.Port())
		}
	}
	return ports
}

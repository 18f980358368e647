//go:build cgo && !race

// Command macfleet-runner serves one GGUF model through llama.cpp (Metal on Apple
// Silicon, CPU elsewhere) over the private protocol of docs/runner-protocol.md. The
// node agent starts one per loaded model.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/spf13/pflag"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/tracing"
	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
	"github.com/macfleet/macfleet/internal/version"
	"github.com/macfleet/macfleet/metal/runner/netdevice"
	"github.com/macfleet/macfleet/metal/runner/server"
)

// Exit codes of docs/runner-protocol.md.
const (
	exitOK         = 0
	exitFailed     = 1
	exitBadFlags   = 2
	exitLoadFailed = 3
	exitSplitLost  = 4
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "worker" {
		return runWorker(args[1:], stdout, stderr)
	}
	if len(args) == 1 && (args[0] == "--version" || args[0] == "version") {
		fmt.Fprintln(stdout, "macfleet-runner", version.Get())
		return exitOK
	}
	cfg, verbosity, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintln(stderr, "macfleet-runner:", err)
		return exitBadFlags
	}
	cfg.Stdout = stdout
	cfg.Log = funcr.NewJSON(func(obj string) { fmt.Fprintln(stderr, obj) },
		funcr.Options{Verbosity: verbosity, LogTimestamp: true}).WithName("runner")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// A tracing runner connects nowhere: its spans wait in memory until the agent
	// drains them over the runner's socket (POST /spans) and exports them.
	var tp *tracing.Provider
	if cfg.Spans != nil {
		tp = tracing.NewRelayed(cfg.Spans, tracing.Options{Service: tracing.ServiceRunner, Log: cfg.Log.WithName("tracing")})
	}
	defer func() {
		// Ends the spans still open into the queue; the agent's last drain, before it
		// stops the runner, has taken the rest.
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = tp.Shutdown(sctx)
	}()
	cfg.TracerProvider = tp.TracerProvider()
	err = server.Run(ctx, cfg)
	var le *server.LoadError
	var sl *server.SplitLostError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &le):
		fmt.Fprintln(stderr, "macfleet-runner:", err)
		return exitLoadFailed
	case errors.As(err, &sl):
		fmt.Fprintln(stderr, "macfleet-runner:", err)
		return exitSplitLost
	default:
		fmt.Fprintln(stderr, "macfleet-runner:", err)
		return exitFailed
	}
}

func parseFlags(args []string, stderr io.Writer) (server.Config, int, error) {
	var cfg server.Config
	fs := pflag.NewFlagSet("macfleet-runner", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.ModelPath, "model", "", "GGUF model file (required)")
	fs.StringVar(&cfg.Draft, "draft", "", "a draft model GGUF for speculative decoding: a smaller model of the same vocabulary whose greedy tokens the model verifies (docs/speculative-decoding.md)")
	draftDevice := fs.String("draft-device", string(netdevice.DeviceAuto), "where the draft model computes: auto (beside a model on a GPU, "+
		"where a step of the draft timed at load was shorter; else the CPU), cpu, or gpu (the model's GPU; refused without one)")
	fs.StringVar(&cfg.Projector, "mmproj", "", "the model's multimodal projector GGUF (mmproj): chat messages may then carry images (docs/models.md, Vision)")
	fs.StringVar(&cfg.Socket, "socket", "", "serve on this unix socket")
	fs.StringVar(&cfg.Addr, "addr", "", "serve on this TCP address (loopback; port 0 picks one)")
	// One core is left to the agent and the runner's own Go code: ggml's thread
	// barriers spin, and a descheduled thread stalls every step (on a busy 2-core host
	// two threads decoded 10x slower than one). The agent passes --threads itself
	// (its thread policy, engine.PolicyThreads).
	engineFlags := engine.BindRunnerFlags(fs, max(1, runtime.NumCPU()-1))
	fs.Int64Var(&cfg.CeilingBytes, "ceiling-bytes", 0, "memory ceiling; prefill that would exceed it is refused (0: none)")
	fs.StringVar(&cfg.Alias, "alias", "", "model name in responses")
	fs.IntVar(&cfg.GPULayers, "gpu-layers", 999, "layers offloaded to the GPU (Metal)")
	fs.BoolVar(&cfg.Mmap, "mmap", runtime.GOOS == "darwin", "map the model file instead of reading it into memory")
	fs.BoolVar(&cfg.ExitWithParent, "exit-with-parent", true, "stop when the parent process (the agent) exits")
	fs.StringVar(&cfg.Nonce, "nonce", "", "opaque token echoed on /health, so an agent adopting this runner can tell it from a stale socket or a recycled pid")
	fs.DurationVar(&cfg.OrphanTimeout, "orphan-timeout", 0, "stop after receiving no request at all for this long (0: never); for runners that outlive their agent")
	fs.StringVar(&cfg.PromptCache.Dir, "prompt-cache-dir", "", "prompt cache SSD tier directory for this runner (empty: no SSD tier)")
	fs.Int64Var(&cfg.PromptCache.HotBytes, "prompt-cache-hot-bytes", 0, "prompt cache hot (memory) tier budget in bytes; POST /cache/budget changes it (0: none)")
	fs.Int64Var(&cfg.PromptCache.SSDBytes, "prompt-cache-ssd-bytes", 0, "prompt cache SSD tier quota in bytes (0: bounded by 99% of the free disk only)")
	fs.IntVar(&cfg.PromptCache.BlockTokens, "prompt-cache-block", server.DefaultPromptCacheBlock, "prompt cache block size in tokens (states are keyed by block-aligned prefixes)")
	fs.StringVar(&cfg.PromptCache.ModelID, "prompt-cache-model-id", "", "names the model in the prompt cache identity, e.g. its digest (default: derived from the file)")
	splitWorkers := fs.StringArray("split-worker", nil, "a worker (`macfleet-runner worker`) at HOST:PORT computing the model's last layers; repeat for several, in layer order, each with its --split-layers (docs/split-model.md)")
	splitLayers := fs.IntSlice("split-layers", nil, "how many layers the matching --split-worker computes")
	splitTokens := fs.Bool("split-tokens-stdin", false, "read from standard input one token per --split-worker (64 hex digits and a newline each), sent first on every connection to it: the head agent's split links require it")
	fs.DurationVar(&cfg.SplitTimeout, "split-timeout", server.DefaultSplitTimeout, "bound on every read and write on a split worker's link: a worker silent for longer is lost")
	fs.IntVar(&cfg.SplitPipeline, "split-pipeline", 1, "llama contexts a split runner decodes at once, each with --parallel divided by it slots, so that its own layers compute for one while a worker computes for another (docs/split-model.md, Pipelining); 1: one context")
	traceRelay := fs.Bool("trace-relay", false, "trace generation requests, keeping the spans in memory for the agent to drain (POST /spans); the runner itself exports nothing")
	fs.StringVar(&cfg.BackendDir, "backend-dir", defaultBackendDir(), backendDirUsage)
	verbose := fs.BoolP("verbose", "v", false, "log llama.cpp's info messages and per-request details")
	if err := fs.Parse(args); err != nil {
		return cfg, 0, err
	}
	cfg.Verbose = *verbose
	var err error
	if cfg.DraftDevice, err = netdevice.ParseDeviceChoice(*draftDevice); err != nil {
		return cfg, 0, fmt.Errorf("--draft-device: %w", err)
	}
	if fs.Changed("draft-device") && cfg.Draft == "" {
		return cfg, 0, errors.New("--draft-device needs --draft: it says where the draft model computes")
	}
	if *traceRelay {
		cfg.Spans = spanrelay.NewQueue(spanrelay.DefaultQueueBytes)
	}
	verbosity := 0
	if cfg.Verbose {
		verbosity = 4
	}
	if err := checkFlags(cfg, fs.Args(), len(*splitWorkers), len(*splitLayers)); err != nil {
		return cfg, 0, err
	}
	for i, addr := range *splitWorkers {
		if (*splitLayers)[i] < 1 {
			return cfg, 0, fmt.Errorf("--split-layers must be positive, got %d for %s", (*splitLayers)[i], addr)
		}
		cfg.Split = append(cfg.Split, server.SplitWorker{Addr: addr, Layers: (*splitLayers)[i]})
	}
	if *splitTokens {
		if err := readSplitTokens(cfg.Split, os.Stdin); err != nil {
			return cfg, 0, err
		}
	}
	e, err := engineFlags.Runner()
	if err != nil {
		return cfg, 0, err
	}
	cfg.Runner = e
	return cfg, verbosity, nil
}

// checkFlags refuses a runner's flags that contradict each other or are out of range
// (args: the arguments left after the flags; workers and layers: how many
// --split-worker and --split-layers were given).
func checkFlags(cfg server.Config, args []string, workers, layers int) error {
	switch {
	case len(args) > 0:
		return fmt.Errorf("unexpected arguments %q", args)
	case cfg.ModelPath == "":
		return errors.New("--model is required")
	case (cfg.Socket == "") == (cfg.Addr == ""):
		return errors.New("exactly one of --socket and --addr is required")
	case cfg.OrphanTimeout < 0:
		return fmt.Errorf("--orphan-timeout must not be negative, got %s", cfg.OrphanTimeout)
	case cfg.PromptCache.HotBytes < 0 || cfg.PromptCache.SSDBytes < 0:
		return errors.New("--prompt-cache-hot-bytes and --prompt-cache-ssd-bytes must not be negative")
	case cfg.PromptCache.BlockTokens < 1:
		return fmt.Errorf("--prompt-cache-block must be positive, got %d", cfg.PromptCache.BlockTokens)
	case cfg.CeilingBytes < 0:
		return fmt.Errorf("--ceiling-bytes must not be negative, got %d", cfg.CeilingBytes)
	case workers != layers:
		return fmt.Errorf("%d --split-worker but %d --split-layers: give one count per worker", workers, layers)
	case cfg.SplitTimeout <= 0:
		return fmt.Errorf("--split-timeout must be positive, got %s", cfg.SplitTimeout)
	case cfg.SplitPipeline < 1:
		return fmt.Errorf("--split-pipeline must be positive, got %d", cfg.SplitPipeline)
	case cfg.SplitPipeline > 1 && workers == 0:
		return errors.New("--split-pipeline needs --split-worker: without workers the runner computes every stage itself")
	}
	return nil
}

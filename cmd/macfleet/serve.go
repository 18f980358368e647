package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/spf13/cobra"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
	"github.com/macfleet/macfleet/internal/tracing"
)

func init() { root.AddCommand(newServeCommand()) }

// serveFlags are the command line of `macfleet serve`.
type serveFlags struct {
	configFile             string
	models                 []string
	projectors             []string
	drafts                 []string
	flags                  config.Config
	ceiling, reserve, body string
	pcHot, pcSSD           string
	idle                   time.Duration
	pcRetention, gcEvery   time.Duration
	verbosity              int
	runnerOutput           bool
	insecure               bool
	allowedHosts           []string
	maxConns               int
	maxConnsPerSource      int
	pull                   pullFlags
}

func newServeCommand() *cobra.Command {
	var sf serveFlags
	cmd := &cobra.Command{
		Use:   "serve --model NAME=PATH|SOURCE[:ctx=N,parallel=N,threads=N,residency=R] [flags]",
		Short: "Serve GGUF models through an OpenAI-compatible API on this machine, without Kubernetes",
		Long: "Runs the node agent standalone: each model is served by its own runner process, " +
			"loaded on demand (or at start for Resident and Pinned models) within the memory ceiling, " +
			"behind the OpenAI API (/v1/...) and the admin API (/api/status, /metrics). Flags override " +
			"the --config file; --model adds models to it.\n\n" +
			"A model's path may be a source instead of a file: hf://OWNER/REPO/FILE.gguf[@REVISION], ollama://NAME[:TAG] " +
			"or an https:// URL. serve pulls it first into the model store (--store-dir, shared with the node agent) " +
			"through the agent's source policy (--source-policy; default: hf:// and ollama:// only), verifies it " +
			"(sha256= when given, the registry's digest for ollama://, the GGUF header) and serves the stored file; " +
			"a file already stored is not downloaded again. --hf-token (or $HF_TOKEN) opens gated models.\n\n" +
			"--model options after the path: ctx (context per sequence; the engine holds ctx × parallel tokens), parallel (slots), threads (its runner's " +
			"CPU threads; default --runner-threads, else the thread policy), residency " +
			"(OnDemand, Resident, Pinned), idle (idle timeout), memory (estimate override, e.g. 2Gi), " +
			"kv (f16, q8_0, q4_0), alias (another name; repeat or join with |), cache (on or off: the prompt cache, " +
			"on by default), hot (cap of the model's share of the hot budget; 0: no hot tier), ssd (the model's " +
			"SSD quota, at most --prompt-cache-ssd-bytes; 0: no SSD tier).\n\n" +
			"The prompt cache keeps the KV state of recent conversations so the next turn restores it instead of " +
			"prefilling it again: in memory (the hot tier, one budget shared by all models) and on disk under " +
			"--prompt-cache-dir (the SSD tier, one directory per model file, kept across restarts).",
		Example: "  macfleet serve --model qwen=/models/qwen2.5-7b-q4_k_m.gguf\n" +
			"  macfleet serve --model qwen=hf://Qwen/Qwen2.5-Coder-7B-Instruct-GGUF/qwen2.5-coder-7b-instruct-q4_k_m.gguf:ctx=32768\n" +
			"  macfleet serve --model llama=ollama://llama3.2:3b\n" +
			"  macfleet serve --model qwen=/m/q.gguf:ctx=16384,parallel=4,residency=Pinned --memory-ceiling 12Gi\n" +
			"  macfleet serve --model qwen=/m/q.gguf:hot=2Gi,ssd=20Gi --prompt-cache-hot-bytes 4Gi\n" +
			"  macfleet serve --config agent.yaml --api-key \"$KEY\"",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return sf.run(cmd) },
	}
	sf.register(cmd)
	cmd.AddCommand(newServeInstallCmd(), newServeUninstallCmd())
	return cmd
}

// config is the agent's configuration: the --config file and the flags over it
// (config.Resolve), with the models given as sources pulled first (pullFlags.pull).
func (sf serveFlags) config(ctx context.Context, log logr.Logger) (config.Config, error) {
	var cfg config.Config
	if sf.configFile != "" {
		var err error
		if cfg, err = config.Load(sf.configFile); err != nil {
			return cfg, err
		}
	}
	for _, m := range sf.models {
		mc, err := config.ParseModelFlag(m)
		if err != nil {
			return cfg, err
		}
		sf.flags.Models = append(sf.flags.Models, mc)
	}
	if err := applyProjectors(sf.flags.Models, sf.projectors); err != nil {
		return cfg, err
	}
	if err := applyFiles(sf.flags.Models, sf.drafts, draftFile); err != nil {
		return cfg, err
	}
	if err := parseSizes(sizeFlag{"memory-ceiling", sf.ceiling, (*int64)(&sf.flags.MemoryCeiling)},
		sizeFlag{"memory-reserve", sf.reserve, (*int64)(&sf.flags.MemoryReserve)},
		sizeFlag{"max-body", sf.body, (*int64)(&sf.flags.MaxBodyBytes)}); err != nil {
		return cfg, err
	}
	var err error
	if sf.flags.PromptCacheHotBytes, err = parseSize("prompt-cache-hot-bytes", sf.pcHot); err != nil {
		return cfg, err
	}
	if sf.flags.PromptCacheSSDBytes, err = parseSize("prompt-cache-ssd-bytes", sf.pcSSD); err != nil {
		return cfg, err
	}
	sf.flags.IdleTimeout = config.Duration(sf.idle)
	if err := sf.pull.pull(ctx, cfg.Models, log); err != nil {
		return cfg, err
	}
	if err := sf.pull.pull(ctx, sf.flags.Models, log); err != nil {
		return cfg, err
	}
	return config.Resolve(cfg, sf.flags)
}

// run checks the flags that are not configuration (standalone.Check) and serves
// until a signal.
func (sf serveFlags) run(cmd *cobra.Command) error {
	log := newLogger(sf.verbosity)
	ctx, stop := shutdownContext(cmd.Context())
	defer stop()
	cfg, err := sf.config(ctx, log)
	if err != nil {
		return err
	}
	opts := standalone.Options{PromptCacheRetention: sf.pcRetention, GCInterval: sf.gcEvery,
		AllowedHosts: sf.allowedHosts, Limits: httpserver.Limits{MaxConnections: sf.maxConns, MaxConnectionsPerSource: sf.maxConnsPerSource}}
	if err := standalone.Check(cfg, opts, sf.insecure); err != nil {
		return err
	}
	opts.Log = log
	policy, err := sf.pull.policy()
	if err != nil {
		return err
	}
	// Image URLs are fetched under the same policy as models, as namespace serve's.
	opts.InlineImages = server.PolicyImages(sourcepolicy.NewHolder(policy), serveNamespace)
	if sf.runnerOutput {
		opts.RunnerOutput = cmd.ErrOrStderr()
	}
	tp, relay, stopTracing, err := startTracing(ctx, tracing.ServiceAgent, log.WithName("tracing"))
	if err != nil {
		return err
	}
	defer stopTracing()
	opts.TracerProvider, opts.SpanRelay = tp, relay
	return standalone.Run(ctx, cfg, opts)
}

// register binds the flags to
func (sf *serveFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&sf.configFile, "config", "", "YAML configuration file (listen, apiKey, memoryCeiling, promptCacheDir, promptCacheHotBytes, promptCacheSSDBytes, "+
		"models: [{name, path, contextLength, parallel, kvCacheType, threads, residency, idleTimeout, memory, aliases, promptCache: {enabled, hotBytes, ssdBytes}}])")
	f.StringArrayVar(&sf.models, "model", nil, "a model to serve: NAME=PATH[:ctx=N,parallel=N,threads=N,residency=OnDemand|Resident|Pinned,idle=D,memory=SIZE,kv=T,alias=A,cache=on|off,hot=SIZE,ssd=SIZE,sha256=HEX] "+
		"(repeatable); PATH may be a source to pull first: hf://OWNER/REPO/FILE.gguf[@REVISION], ollama://NAME[:TAG], https://…")
	f.StringArrayVar(&sf.projectors, "projector", nil, projectorFlagUsage)
	f.StringArrayVar(&sf.drafts, "draft", nil, draftFlagUsage)
	f.StringVar(&sf.flags.Listen, "listen", "", "address of the API (default "+config.DefaultListen+")")
	f.StringVar(&sf.ceiling, "memory-ceiling", "", "cap the memory of all models together, e.g. 12Gi (default: the machine's ceiling)")
	f.StringVar(&sf.reserve, "memory-reserve", "", "memory left to the OS below the machine's ceiling (default 4Gi below 24Gi of RAM, else 6Gi)")
	f.StringVar(&sf.flags.APIKey, "api-key", "", "require this key as Authorization: Bearer KEY (not on /healthz, /readyz)")
	f.StringVar(&sf.flags.APIKeyFile, "api-key-file", "", "read the API key from a file")
	f.BoolVar(&sf.insecure, "insecure", false, "serve without an API key on an address other machines can reach (--listen 0.0.0.0:8080, a LAN address); "+
		"without it, serve refuses to start so")
	f.StringSliceVar(&sf.allowedHosts, "allowed-hosts", nil, "names the API answers to in the Host header besides localhost, IP addresses and the --listen host, "+
		"e.g. mymac.local or .example.com for every name under it; * turns the check off. Requests naming another host are refused "+
		"(a web page's name re-resolved to this machine, DNS rebinding); so are browsers' cross-origin requests")
	f.IntVar(&sf.maxConns, "max-connections", httpserver.DefaultMaxConnections, "connections the API holds open at once; the next one is answered 503 with Retry-After")
	f.IntVar(&sf.maxConnsPerSource, "max-connections-per-source", 0, "connections the API holds open from one source address (an IPv6 /64) "+
		"at once; the next one is answered 503 with Retry-After. 0: a quarter of --max-connections; negative: no cap per source")
	f.StringVar(&sf.flags.Runner, "runner", "", "the macfleet-runner binary (default $MACFLEET_RUNNER, else next to macfleet, else on $PATH)")
	f.IntVar(&sf.flags.RunnerThreads, "runner-threads", 0, "CPU threads of each runner whose model sets none (default: the thread policy: the performance cores, one for a model under 32 MiB of weights)")
	f.StringVar(&sf.flags.RunnerSandbox, "runner-sandbox", "", "confine each runner to its model, cache and socket, with no network and a scrubbed "+
		"environment (Landlock on Linux, Seatbelt on macOS): on or off (default on)")
	f.BoolVar(&sf.flags.AllowUnconfinedRunners, "allow-unconfined-runners", false, "start runners even where the sandbox is on but this "+
		"machine cannot enforce it (no Landlock, no sandbox-exec): unconfined, with a scrubbed environment; without it they are refused")
	f.DurationVar(&sf.idle, "idle-timeout", 0, "unload OnDemand models idle this long (default 5m)")
	f.StringVar(&sf.body, "max-body", "", "request body limit (default 16Mi)")
	f.StringVar(&sf.flags.PromptCacheDir, "prompt-cache-dir", "", "directory of the prompt cache's SSD tier, one subdirectory per model file (default "+
		config.DataDir("prompt-cache")+")")
	f.StringVar(&sf.pcHot, "prompt-cache-hot-bytes", "", "prompt cache memory (hot tier) shared by all models, e.g. 4Gi; 0 turns the hot tier off (default: a tenth of the memory ceiling)")
	f.StringVar(&sf.pcSSD, "prompt-cache-ssd-bytes", "", "prompt cache SSD quota of each model, and the most a model's ssd= may set; 0 turns the SSD tier off (default 10Gi)")
	f.DurationVar(&sf.pcRetention, "prompt-cache-retention", 24*time.Hour, "delete the prompt cache directories of model files no longer served "+
		"once nothing in them changed for this long; 0 never deletes (model files are never deleted)")
	f.DurationVar(&sf.gcEvery, "gc-interval", janitor.DefaultInterval, "how often the prompt cache directories are pruned (the first time a minute after the start)")
	f.IntVarP(&sf.verbosity, "verbosity", "v", 0, "log verbosity (1: runner output and more, 2: every request)")
	f.BoolVar(&sf.runnerOutput, "runner-output", false, "copy every runner's output to stderr, prefixed with its model")
	sf.pull.register(f)
}

// newLogger logs "time level message key=value..." lines to stderr.
func newLogger(verbosity int) logr.Logger {
	return funcr.New(func(prefix, args string) {
		ts := time.Now().Format("2006-01-02T15:04:05.000Z07:00")
		if prefix != "" {
			fmt.Fprintln(os.Stderr, ts, prefix+":", args)
			return
		}
		fmt.Fprintln(os.Stderr, ts, args)
	}, funcr.Options{Verbosity: verbosity})
}

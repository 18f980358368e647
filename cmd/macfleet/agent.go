package main

import (
	"context"
	goflag "flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/macfleet/macfleet/agent/clustermode"
	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/agent/hubtoken"
	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/agent/macnode"
	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
	"github.com/macfleet/macfleet/internal/tracing"
	"github.com/macfleet/macfleet/internal/version"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

func init() { root.AddCommand(newAgentCmd()) }

// agentFlags are the command line of `macfleet agent`: the agent's options
// (clustermode.Options, bound directly but for the sizes, parsed in config) and the
// rest that this command wires in.
type agentFlags struct {
	opts                                        clustermode.Options
	kubeconfig, fleetTokenFile                  string
	runnerOutput                                bool
	leaseDuration                               time.Duration
	ceiling, reserve, pcHot, pcSSD              string
	hfEndpoint, ollamaRegistry, hfToken         string
	chip, unifiedMemory, workingSet, wiredLimit string
	cpuCores, gpuCores                          int
	maxModelBytes                               string
	storeCapacity                               string
	allowFileDirs                               []string
}

func newAgentCmd() *cobra.Command {
	var (
		fl      agentFlags
		zapOpts = zap.Options{Development: false}
	)
	host, _ := os.Hostname()
	host = strings.ToLower(strings.SplitN(host, ".", 2)[0])
	cmd := &cobra.Command{
		Use:   "agent --kubeconfig node.kubeconfig [--node-name NAME] [flags]",
		Short: "Run the node agent of a Mac in a fleet: register it, load the replicas bound to it, serve them",
		Long: `Run the node agent in cluster mode. It registers this Mac as a MacNode (hardware,
labels), renews its Lease, and watches the ModelReplicas the scheduler binds to it:
each is downloaded into the model store (resumable, sha256-verified), loaded into the
engine pool (Resident and Pinned at once, OnDemand on the first request) and reported
in the replica's status (Downloaded, Loaded, Ready, endpoint, memory, last unload).
The OpenAI and admin API on --listen is served over TLS with this Mac's own
certificate, which the agent asks the manager for with its node credential
(CertificateSigningRequest, signer macfleet.dev/node) and renews; it takes the client
certificates of the gateways and the manager (all but /healthz and /readyz need one),
and on the OpenAI API (/v1/) in-cluster callers' ServiceAccount tokens (--token-audience), each reaching
only the replicas its namespace may use; requests pick their
replica by the X-Macfleet-Replica header or by served name. The agent keeps serving
while the API server is unreachable and resyncs when it returns.`,
		Example: "  macfleet agent --kubeconfig mac-1.kubeconfig\n" +
			"  macfleet agent --kubeconfig kc --node-name mac-2 --listen :8081 --memory-ceiling 12Gi \\\n" +
			"      --unified-memory 16Gi --chip 'Apple M2'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return fl.run(cmd, zapOpts) },
	}
	fl.register(cmd, host, &zapOpts)
	cmd.AddCommand(newAgentInstallCmd(), newAgentUninstallCmd())
	return cmd
}

// run starts the node agent: flags to clustermode.Config, the node credential's renewal,
// the store, the gauge, the node session and tracing wired in, then clustermode.Run.
func (fl agentFlags) run(cmd *cobra.Command, zapOpts zap.Options) error {
	log := zap.New(zap.UseFlagOptions(&zapOpts))
	ctrl.SetLogger(log)
	cfg, ov, err := fl.config()
	if err != nil {
		return err
	}
	rc, err := restConfig(fl.kubeconfig)
	if err != nil {
		return err
	}
	renew, err := clustermode.CredentialRenewal(rc, credentials.KubeconfigFile(fl.kubeconfig, os.Getenv("KUBECONFIG")), log)
	if err != nil {
		return err
	}
	if renew != nil {
		cfg.Runnables = append(cfg.Runnables, renew)
	}
	cfg.RestConfig = rc
	cfg.Log = log
	if fl.runnerOutput {
		cfg.RunnerOutput = cmd.ErrOrStderr()
	}
	ctx, stop := shutdownContext(cmd.Context())
	defer stop()

	if fl.fleetTokenFile != "" {
		log.Info("Ignoring --fleet-token-file: the agent serves TLS with its own certificate and takes the gateways' and the manager's certificates instead of a fleet token")
	}
	// The store's downloads and file opens follow the cluster's SourcePolicy, which
	// the agent watches.
	policy := sourcepolicy.NewHolder(nil)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating the API clientset: %w", err)
	}
	hub := &hubtoken.Source{Clientset: cs, Log: log.WithName("hubtoken")}
	st, err := fl.newStore(policy, hub.Token, log.WithName("store"))
	if err != nil {
		return err
	}
	cfg.Store, cfg.SourcePolicy = st, policy
	gauge, err := enginepool.NewGauge()
	if err != nil {
		return fmt.Errorf("measuring memory: %w", err)
	}
	cfg.Gauge = hardware.OverrideGauge(gauge, ov)
	cfg.Runnables = append(cfg.Runnables, nodeSession(fl, cfg.Pool.CeilingBytes))
	tp, relay, stopTracing, err := startTracing(ctx, tracing.ServiceAgent, log.WithName("tracing"))
	if err != nil {
		return err
	}
	defer stopTracing()
	cfg.TracerProvider, cfg.SpanRelay = tp, relay
	log.Info("Starting the node agent", "node", cfg.NodeName, "store", fl.opts.StoreDir, "state", fl.opts.StateDir,
		"listen", cfg.Listen)
	return clustermode.Run(ctx, cfg)
}

// register binds the agent's flags to fl and zapOpts.
func (fl *agentFlags) register(cmd *cobra.Command, host string, zapOpts *zap.Options) {
	f := cmd.Flags()
	f.StringVar(&fl.kubeconfig, "kubeconfig", "", "Path to the node's kubeconfig (from macfleet nodes credentials); default: $KUBECONFIG, then in-cluster")
	f.StringVar(&fl.opts.NodeName, "node-name", host, "Name of this Mac's MacNode (and of its node identity)")
	f.StringVar(&fl.opts.Listen, "listen", ":8080", "Address of the OpenAI and admin API")
	f.StringVar(&fl.opts.AdvertiseAddress, "advertise-address", "", "host:port the gateway and Services reach this agent at (default: the first non-loopback IPv4 address and the listen port; port 0 means the listen port)")
	f.StringVar(&fl.opts.Connect, "connect", "", "How the fleet reaches this agent: inbound (at --advertise-address), "+
		"outbound (a Mac behind a NAT: the agent dials the gateway's --tunnel-listen at --gateway-tunnel and serves its requests through that connection) "+
		"or auto (through that connection while the gateway's probe does not reach --advertise-address) (default: auto with --gateway-tunnel, inbound without)")
	f.StringVar(&fl.opts.GatewayTunnel, "gateway-tunnel", "", "With --connect outbound or auto, host:port of the gateway's tunnel listener (its --tunnel-listen)")
	f.DurationVar(&fl.opts.TunnelProbeInterval, "tunnel-probe-interval", 0, "With --connect auto, how often the agent asks the gateway again whether it "+
		"reaches --advertise-address while it holds no tunnel: a Mac that stops answering there dials out within about this long (default 30s; at least 5s)")
	f.StringVar(&fl.opts.StoreDir, "store-dir", config.DataDir("models"), "Model store directory (persistent; shared by the replicas of one file)")
	f.StringVar(&fl.maxModelBytes, "max-model-bytes", "", "Refuse to download a model file larger than this, e.g. 60Gi (default: no limit)")
	f.StringVar(&fl.storeCapacity, "store-capacity", "", "Most bytes the files under --store-dir may take together, e.g. 200Gi: a download that "+
		"does not fit fails as on a full disk (default: the file system's free space alone decides)")
	f.StringSliceVar(&fl.allowFileDirs, "allow-file-dir", nil, "Directory on this Mac that file:// sources may be in, besides what the cluster's "+
		"SourcePolicy allows (repeatable; default: the SourcePolicy alone decides)")
	f.StringVar(&fl.opts.StateDir, "state-dir", config.DataDir("state"), "Directory for the agent's own state (its TLS key, pinned to the Mac; runner records for adoption)")
	f.StringVar(&fl.fleetTokenFile, "fleet-token-file", "", "Ignored: the agent gets its own certificate (CertificateSigningRequest, signer macfleet.dev/node) and no fleet token")
	_ = f.MarkDeprecated("fleet-token-file", "the agent serves TLS with its own certificate; remove the flag")
	f.StringVar(&fl.opts.TokenAudience, "token-audience", satoken.DefaultAudience, "The OpenAI API (a deployment's Service) also takes in-cluster "+
		"callers' ServiceAccount tokens projected for this audience, checked by a TokenReview; each reaches its namespace's replicas and those granted to it (spec.access)")
	f.StringVar(&fl.opts.TokenIssuer, "token-issuer", "", "The issuer a ServiceAccount token must name to be reviewed (default: the API server's, "+
		"from its "+satoken.DiscoveryPath+"); tokens of another issuer are refused without a TokenReview")
	f.BoolVar(&fl.opts.NoServiceAccountTokens, "no-service-account-tokens", false, "Take only the gateways' and the manager's certificates, not ServiceAccount tokens")
	f.DurationVar(&fl.opts.TokenCacheTTL, "token-cache-ttl", satoken.DefaultTTL, "How long a ServiceAccount token's review is reused: "+
		"the longest a deleted ServiceAccount's token keeps working")
	f.DurationVar(&fl.leaseDuration, "lease-duration", macnode.DefaultLeaseDuration, "The node Lease's duration; it is renewed every quarter of it")
	f.StringVar(&fl.ceiling, "memory-ceiling", "", "Cap the memory of all models together, e.g. 12Gi (default: the Mac's ceiling; the MacNode's spec.memoryCeiling lowers it)")
	f.StringVar(&fl.reserve, "memory-reserve", "", "Memory left to the OS below the Mac's ceiling (default 4Gi below 24Gi of RAM, else 6Gi)")
	f.StringVar(&fl.opts.RunnerPath, "runner", "", "The macfleet-runner binary (default $MACFLEET_RUNNER, else next to macfleet, else on $PATH)")
	f.IntVar(&fl.opts.RunnerThreads, "runner-threads", 0, "CPU threads of each runner whose model sets none (default: the thread policy: the performance cores, one for a model under 32 MiB of weights)")
	f.StringVar(&fl.opts.RunnerSandbox, "runner-sandbox", string(sandbox.On), "Confine each runner to its model, cache and socket, with no network "+
		"and a scrubbed environment (Landlock on Linux, Seatbelt on macOS): on or off")
	f.BoolVar(&fl.opts.AllowUnconfinedRunners, "allow-unconfined-runners", false, "Start runners even where the sandbox is on but this "+
		"machine cannot enforce it (no Landlock, no sandbox-exec): unconfined, with a scrubbed environment; without it they are refused")
	f.BoolVar(&fl.opts.KeepRunners, "keep-runners", true, "Leave the runners of loaded models running when the agent stops, for the next agent "+
		"to adopt (recorded under --state-dir; an unadopted runner exits after 5m without requests); false unloads everything on exit")
	f.StringVar(&fl.opts.PromptCacheDir, "prompt-cache-dir", config.DataDir("prompt-cache"), "Directory of the prompt cache's SSD tier: one subdirectory per namespace and model file, kept across restarts (empty: no SSD tier)")
	f.StringVar(&fl.pcHot, "prompt-cache-hot-bytes", "", "Prompt cache memory (hot tier) shared by the replicas on this Mac, e.g. 4Gi; 0 turns the hot tier off (default: a tenth of the memory ceiling)")
	f.StringVar(&fl.pcSSD, "prompt-cache-ssd-bytes", "", "Prompt cache SSD quota of each model of each namespace (its replicas on this Mac share one directory and this quota), and the most a deployment's promptCache.ssdBytes may set; 0 turns the SSD tier off (default 10Gi)")
	f.DurationVar(&fl.opts.StoreRetention, "store-retention", 24*time.Hour, "Delete the model store's files that no replica bound to this Mac needs "+
		"once no agent sharing --store-dir used them for this long, and partial downloads idle this long; 0 never deletes")
	f.DurationVar(&fl.opts.PromptCacheRetention, "prompt-cache-retention", 24*time.Hour, "Delete the prompt cache directories of model files no replica on this Mac uses "+
		"once nothing in them changed for this long; 0 never deletes")
	f.DurationVar(&fl.opts.GCInterval, "gc-interval", janitor.DefaultInterval, "How often the store and prompt cache directories are pruned "+
		"(the first time a minute after the replicas are known)")
	f.BoolVar(&fl.runnerOutput, "runner-output", false, "Copy every runner's output to stderr, prefixed with its replica")
	f.StringVar(&fl.hfEndpoint, "hf-endpoint", modelsource.DefaultHFEndpoint, "Model hub that hf:// sources download from")
	f.StringVar(&fl.ollamaRegistry, "ollama-registry", modelsource.DefaultOllamaRegistry, "Registry that ollama:// sources download from")
	f.StringVar(&fl.hfToken, "hf-token", "", "Token sent with hf:// downloads, for gated and private models (default $"+hfTokenEnv+", else the fleet's Secret "+
		"macfleet-system/"+hubtoken.SecretName+", key "+hubtoken.Key+", read every minute); every replica on this Mac downloads with it")
	f.StringVar(&fl.chip, "chip", "", "Override the detected chip name (to simulate a Mac), e.g. 'Apple M2 Max'")
	f.StringVar(&fl.unifiedMemory, "unified-memory", "", "Override the detected memory, e.g. 16Gi (the ceiling follows)")
	f.IntVar(&fl.cpuCores, "cpu-cores", 0, "Override the detected CPU cores")
	f.IntVar(&fl.gpuCores, "gpu-cores", 0, "Override the detected GPU cores")
	f.StringVar(&fl.workingSet, "metal-working-set", "", "Override Metal's recommended working set, e.g. 12Gi")
	f.StringVar(&fl.wiredLimit, "wired-limit", "", "Override iogpu.wired_limit_mb, as a size, e.g. 14Gi")
	gfs := goflag.NewFlagSet("zap", goflag.ContinueOnError)
	zapOpts.BindFlags(gfs)
	f.AddGoFlagSet(gfs)
}

// storeOptions are the model store's options from the flags (without the log and
// the source policy, which the caller sets).
func (fl agentFlags) storeOptions() (store.Options, error) {
	opts := store.Options{HFEndpoint: fl.hfEndpoint, OllamaRegistry: fl.ollamaRegistry, HFToken: fl.hfToken}
	if opts.HFToken == "" {
		opts.HFToken = os.Getenv(hfTokenEnv)
	}
	if err := parseSizes(sizeFlag{"max-model-bytes", fl.maxModelBytes, &opts.MaxModelBytes},
		sizeFlag{"store-capacity", fl.storeCapacity, &opts.Capacity}); err != nil {
		return opts, err
	}
	dirs, err := store.LocalFileDirs(fl.allowFileDirs)
	if err != nil {
		return opts, fmt.Errorf("--allow-file-dir %w", err)
	}
	opts.LocalFileDirs = dirs
	return opts, nil
}

// config is the agent's configuration (clustermode.Options.Config) and hardware
// overrides from the flags, with the store and state directories created.
func (fl agentFlags) config() (clustermode.Config, hardware.Overrides, error) {
	o := fl.opts
	ov := hardware.Overrides{Chip: fl.chip, CPUCores: fl.cpuCores, GPUCores: fl.gpuCores}
	if err := parseSizes(sizeFlag{"memory-ceiling", fl.ceiling, &o.CeilingBytes}, sizeFlag{"memory-reserve", fl.reserve, &o.ReserveBytes},
		sizeFlag{"unified-memory", fl.unifiedMemory, &ov.UnifiedMemoryBytes},
		sizeFlag{"metal-working-set", fl.workingSet, &ov.MetalWorkingSetBytes},
		sizeFlag{"wired-limit", fl.wiredLimit, &ov.WiredLimitBytes}); err != nil {
		return clustermode.Config{}, ov, err
	}
	var err error
	if o.PromptCacheHotBytes, err = parseSize("prompt-cache-hot-bytes", fl.pcHot); err != nil {
		return clustermode.Config{}, ov, err
	}
	if o.PromptCacheSSDBytes, err = parseSize("prompt-cache-ssd-bytes", fl.pcSSD); err != nil {
		return clustermode.Config{}, ov, err
	}
	cfg, err := o.Config()
	if err != nil {
		return cfg, ov, err
	}
	if err := ov.Validate(); err != nil {
		return cfg, ov, err
	}
	return cfg, ov, o.CreateDirs()
}

// sizeFlag is a size flag: its name, its value as given (in) and where the size goes
// (dst, left alone when the flag is not given).
type sizeFlag struct {
	name, in string
	dst      *int64
}

// parseSizes parses the size flags given.
func parseSizes(flags ...sizeFlag) error {
	for _, f := range flags {
		v, err := parseSize(f.name, f.in)
		if err != nil {
			return err
		}
		if v != nil {
			*f.dst = int64(*v)
		}
	}
	return nil
}

// parseSize parses the size flag name given as in; nil when not given.
func parseSize(name, in string) (*config.Size, error) {
	if in == "" {
		return nil, nil
	}
	v, err := config.ParseSize(in)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", name, err)
	}
	return &v, nil
}

// nodeSession registers the MacNode and renews its Lease beside the replica sync
// (macnode.NewForPool: the pool's events trigger memory status writes, and the MacNode's
// spec.memoryCeiling lowers the pool's ceiling together with --memory-ceiling).
func nodeSession(fl agentFlags, flagCeiling int64) clustermode.Runnable {
	return func(ctx context.Context, env clustermode.Env) error {
		s, err := macnode.NewForPool(macnode.Config{
			Client: env.Client, NodeName: env.NodeName, Address: env.Endpoint, Version: agentVersion(),
			LeaseDuration: fl.leaseDuration, Log: ctrl.Log.WithName("node"), FlagCeiling: flagCeiling,
		}, env.Pool)
		if err != nil {
			return err
		}
		return s.Run(ctx)
	}
}

// shutdownContext ends at the first SIGINT or SIGTERM, for a graceful shutdown; a
// second one kills the process at once (the default handling is back).
func shutdownContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}

// agentVersion is the release the binary was built from (internal/version).
func agentVersion() string { return version.Get().Version }

package main

import (
	"context"
	"errors"
	goflag "flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/macfleet/macfleet/agent/clustermode"
	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/agent/macnode"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/enginepool"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/runner/sandbox"
	"github.com/macfleet/macfleet/sourcepolicy"
	"github.com/macfleet/macfleet/tenancy/satoken"
	"github.com/macfleet/macfleet/tracing"
)

func init() { root.AddCommand(newAgentCmd()) }

// agentFlags are the command line of `macfleet agent`.
type agentFlags struct {
	kubeconfig, nodeName, listen, advertise     string
	storeDir, stateDir, fleetTokenFile          string
	runner, runnerSandbox                       string
	runnerThreads                               int
	runnerOutput, keepRunners                   bool
	leaseDuration                               time.Duration
	ceiling, reserve                            string
	hfEndpoint, ollamaRegistry                  string
	chip, unifiedMemory, workingSet, wiredLimit string
	cpuCores, gpuCores                          int
	promptCacheDir, pcHot, pcSSD                string
	storeRetention, pcRetention, gcInterval     time.Duration
	maxModelBytes                               string
	storeCapacity                               string
	allowFileDirs                               []string
	tokenAudience                               string
	noSATokens                                  bool
	tokenCacheTTL                               time.Duration
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
	cmd.AddCommand(newAgentInstallCmd())
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
	if err := renewCredential(rc, fl.kubeconfig, &cfg, log); err != nil {
		return err
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
	st, err := fl.newStore(policy, log.WithName("store"))
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
	log.Info("Starting the node agent", "node", cfg.NodeName, "store", fl.storeDir, "state", fl.stateDir,
		"listen", cfg.Listen)
	return clustermode.Run(ctx, cfg)
}

// register binds the agent's flags to fl and zapOpts.
func (fl *agentFlags) register(cmd *cobra.Command, host string, zapOpts *zap.Options) {
	f := cmd.Flags()
	f.StringVar(&fl.kubeconfig, "kubeconfig", "", "Path to the node's kubeconfig (from macfleet nodes credentials); default: $KUBECONFIG, then in-cluster")
	f.StringVar(&fl.nodeName, "node-name", host, "Name of this Mac's MacNode (and of its node identity)")
	f.StringVar(&fl.listen, "listen", ":8080", "Address of the OpenAI and admin API")
	f.StringVar(&fl.advertise, "advertise-address", "", "host:port the gateway and Services reach this agent at (default: the first non-loopback IPv4 address and the listen port; port 0 means the listen port)")
	f.StringVar(&fl.storeDir, "store-dir", defaultDataDir("models"), "Model store directory (persistent; shared by the replicas of one file)")
	f.StringVar(&fl.maxModelBytes, "max-model-bytes", "", "Refuse to download a model file larger than this, e.g. 60Gi (default: no limit)")
	f.StringVar(&fl.storeCapacity, "store-capacity", "", "Most bytes the files under --store-dir may take together, e.g. 200Gi: a download that "+
		"does not fit fails as on a full disk (default: the file system's free space alone decides)")
	f.StringSliceVar(&fl.allowFileDirs, "allow-file-dir", nil, "Directory on this Mac that file:// sources may be in, besides what the cluster's "+
		"SourcePolicy allows (repeatable; default: the SourcePolicy alone decides)")
	f.StringVar(&fl.stateDir, "state-dir", defaultDataDir("state"), "Directory for the agent's own state (its TLS key, pinned to the Mac; runner records for adoption)")
	f.StringVar(&fl.fleetTokenFile, "fleet-token-file", "", "Ignored: the agent gets its own certificate (CertificateSigningRequest, signer macfleet.dev/node) and no fleet token")
	_ = f.MarkDeprecated("fleet-token-file", "the agent serves TLS with its own certificate; remove the flag")
	f.StringVar(&fl.tokenAudience, "token-audience", satoken.DefaultAudience, "The OpenAI API (a deployment's Service) also takes in-cluster "+
		"callers' ServiceAccount tokens projected for this audience, checked by a TokenReview; each reaches its namespace's replicas and those granted to it (spec.access)")
	f.BoolVar(&fl.noSATokens, "no-service-account-tokens", false, "Take only the gateways' and the manager's certificates, not ServiceAccount tokens")
	f.DurationVar(&fl.tokenCacheTTL, "token-cache-ttl", satoken.DefaultTTL, "How long a ServiceAccount token's review is reused: "+
		"the longest a deleted ServiceAccount's token keeps working")
	f.DurationVar(&fl.leaseDuration, "lease-duration", macnode.DefaultLeaseDuration, "The node Lease's duration; it is renewed every quarter of it")
	f.StringVar(&fl.ceiling, "memory-ceiling", "", "Cap the memory of all models together, e.g. 12Gi (default: the Mac's ceiling; the MacNode's spec.memoryCeiling lowers it)")
	f.StringVar(&fl.reserve, "memory-reserve", "", "Memory left to the OS below the Mac's ceiling (default 4Gi below 24Gi of RAM, else 6Gi)")
	f.StringVar(&fl.runner, "runner", "", "The macfleet-runner binary (default $MACFLEET_RUNNER, else next to macfleet, else on $PATH)")
	f.IntVar(&fl.runnerThreads, "runner-threads", 0, "CPU threads of each runner whose model sets none (default: the thread policy: the performance cores, one for a model under 32 MiB of weights)")
	f.StringVar(&fl.runnerSandbox, "runner-sandbox", string(sandbox.On), "Confine each runner to its model, cache and socket, with no network "+
		"and a scrubbed environment (Landlock on Linux, Seatbelt on macOS): on or off")
	f.BoolVar(&fl.keepRunners, "keep-runners", true, "Leave the runners of loaded models running when the agent stops, for the next agent "+
		"to adopt (recorded under --state-dir; an unadopted runner exits after 5m without requests); false unloads everything on exit")
	f.StringVar(&fl.promptCacheDir, "prompt-cache-dir", defaultDataDir("prompt-cache"), "Directory of the prompt cache's SSD tier: one subdirectory per namespace and model file, kept across restarts (empty: no SSD tier)")
	f.StringVar(&fl.pcHot, "prompt-cache-hot-bytes", "", "Prompt cache memory (hot tier) shared by the replicas on this Mac, e.g. 4Gi; 0 turns the hot tier off (default: a tenth of the memory ceiling)")
	f.StringVar(&fl.pcSSD, "prompt-cache-ssd-bytes", "", "Prompt cache SSD quota of each replica, and the most a deployment's promptCache.ssdBytes may set; 0 turns the SSD tier off (default 10Gi)")
	f.DurationVar(&fl.storeRetention, "store-retention", 24*time.Hour, "Delete the model store's files that no replica bound to this Mac needs "+
		"once no agent sharing --store-dir used them for this long, and partial downloads idle this long; 0 never deletes")
	f.DurationVar(&fl.pcRetention, "prompt-cache-retention", 24*time.Hour, "Delete the prompt cache directories of model files no replica on this Mac uses "+
		"once nothing in them changed for this long; 0 never deletes")
	f.DurationVar(&fl.gcInterval, "gc-interval", janitor.DefaultInterval, "How often the store and prompt cache directories are pruned "+
		"(the first time a minute after the replicas are known)")
	f.BoolVar(&fl.runnerOutput, "runner-output", false, "Copy every runner's output to stderr, prefixed with its replica")
	f.StringVar(&fl.hfEndpoint, "hf-endpoint", modelsource.DefaultHFEndpoint, "Model hub that hf:// sources download from")
	f.StringVar(&fl.ollamaRegistry, "ollama-registry", modelsource.DefaultOllamaRegistry, "Registry that ollama:// sources download from")
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
	opts := store.Options{HFEndpoint: fl.hfEndpoint, OllamaRegistry: fl.ollamaRegistry}
	if fl.maxModelBytes != "" {
		v, err := config.ParseSize(fl.maxModelBytes)
		if err != nil {
			return opts, fmt.Errorf("--max-model-bytes: %w", err)
		}
		opts.MaxModelBytes = int64(v)
	}
	if fl.storeCapacity != "" {
		v, err := config.ParseSize(fl.storeCapacity)
		if err != nil {
			return opts, fmt.Errorf("--store-capacity: %w", err)
		}
		opts.Capacity = int64(v)
	}
	for _, d := range fl.allowFileDirs {
		if !filepath.IsAbs(d) {
			return opts, fmt.Errorf("--allow-file-dir %q: want an absolute directory", d)
		}
		opts.LocalFileDirs = append(opts.LocalFileDirs, filepath.Clean(d))
	}
	return opts, nil
}

// config turns the flags into the agent's configuration and hardware overrides.
func (fl agentFlags) config() (clustermode.Config, hardware.Overrides, error) {
	var cfg clustermode.Config
	var ov hardware.Overrides
	cfg.TokenAudience, cfg.NoServiceAccountTokens, cfg.TokenCacheTTL = fl.tokenAudience, fl.noSATokens, fl.tokenCacheTTL
	if fl.nodeName == "" {
		return cfg, ov, fmt.Errorf("--node-name is required (the hostname is not available)")
	}
	sizes := []struct {
		name string
		in   string
		dst  *int64
	}{
		{"memory-ceiling", fl.ceiling, &cfg.Pool.CeilingBytes}, {"memory-reserve", fl.reserve, &cfg.Pool.ReserveBytes},
		{"unified-memory", fl.unifiedMemory, &ov.UnifiedMemoryBytes}, {"metal-working-set", fl.workingSet, &ov.MetalWorkingSetBytes},
		{"wired-limit", fl.wiredLimit, &ov.WiredLimitBytes},
	}
	for _, s := range sizes {
		if s.in == "" {
			continue
		}
		v, err := config.ParseSize(s.in)
		if err != nil {
			return cfg, ov, fmt.Errorf("--%s: %w", s.name, err)
		}
		*s.dst = int64(v)
	}
	cfg.PromptCacheSSDBytes = config.DefaultPromptCacheSSDBytes
	for _, pc := range []struct {
		name, in string
		set      func(config.Size)
	}{
		{"prompt-cache-hot-bytes", fl.pcHot, func(v config.Size) { cfg.Pool.PromptCacheHotBytes = standalone.PromptCacheHotBytes(&v) }},
		{"prompt-cache-ssd-bytes", fl.pcSSD, func(v config.Size) { cfg.PromptCacheSSDBytes = int64(v) }},
	} {
		if pc.in == "" {
			continue
		}
		v, err := config.ParseSize(pc.in)
		if err != nil {
			return cfg, ov, fmt.Errorf("--%s: %w", pc.name, err)
		}
		pc.set(v)
	}
	if fl.promptCacheDir != "" {
		dir, err := filepath.Abs(fl.promptCacheDir)
		if err != nil {
			return cfg, ov, fmt.Errorf("--prompt-cache-dir: %w", err)
		}
		cfg.PromptCacheDir = dir
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"store-retention", fl.storeRetention}, {"prompt-cache-retention", fl.pcRetention}, {"gc-interval", fl.gcInterval}} {
		if d.v < 0 {
			return cfg, ov, fmt.Errorf("--%s: %s is negative", d.name, d.v)
		}
	}
	cfg.Janitor = janitor.Options{StoreRetention: fl.storeRetention, PromptCacheRetention: fl.pcRetention,
		Interval: fl.gcInterval}
	ov.Chip, ov.CPUCores, ov.GPUCores = fl.chip, fl.cpuCores, fl.gpuCores
	if err := ov.Validate(); err != nil {
		return cfg, ov, err
	}
	for _, d := range []struct{ flag, dir string }{{"store-dir", fl.storeDir}, {"state-dir", fl.stateDir}} {
		if d.dir == "" {
			return cfg, ov, fmt.Errorf("--%s is required (no home directory to default to)", d.flag)
		}
		if err := os.MkdirAll(d.dir, 0o755); err != nil {
			return cfg, ov, fmt.Errorf("--%s: %w", d.flag, err)
		}
	}
	cfg.NodeName, cfg.Listen, cfg.AdvertiseAddress = fl.nodeName, fl.listen, fl.advertise
	cfg.RunnerPath, cfg.RunnerThreads, cfg.StateDir = fl.runner, fl.runnerThreads, fl.stateDir
	cfg.KeepRunners = fl.keepRunners
	mode, err := sandbox.ParseMode(fl.runnerSandbox)
	if err != nil {
		return cfg, ov, fmt.Errorf("--runner-sandbox: %w", err)
	}
	cfg.RunnerSandbox = mode
	return cfg, ov, nil
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

// renewCredential has the agent renew its node token before it expires, rewriting the
// kubeconfig file with each new one (internal/credentials.Rotator): every client made
// from rc afterwards uses the current token. A credential that is not a bound node
// token is used as it is, until it expires.
func renewCredential(rc *rest.Config, kubeconfig string, cfg *clustermode.Config, log logr.Logger) error {
	if kubeconfig == "" && !strings.ContainsRune(os.Getenv("KUBECONFIG"), filepath.ListSeparator) {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	rot, err := credentials.NewRotator(rc, kubeconfig, log.WithName("credential"))
	switch {
	case errors.Is(err, credentials.ErrNotRenewable):
		log.Info("The node credential is not a bound node token: it is used as it is until it expires; "+
			"`macfleet nodes credentials` issues one the agent renews", "kubeconfig", kubeconfig)
		return nil
	case err != nil:
		return err
	}
	c := rot.Claims()
	log.Info("Renewing the node token before it expires", "expires", c.Expires, "renewAt", credentials.RenewAt(c),
		"boundTo", c.Namespace+"/"+c.Secret)
	cfg.Runnables = append(cfg.Runnables, func(ctx context.Context, _ clustermode.Env) error { return rot.Run(ctx) })
	return nil
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

// agentVersion is the module version the binary was built from.
func agentVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// defaultDataDir is where the agent keeps sub persistently: on macOS
// ~/Library/Application Support/macfleet/<sub>, elsewhere $XDG_DATA_HOME/macfleet/<sub>
// or ~/.local/share/macfleet/<sub>. Never a temporary directory: models are large.
func defaultDataDir(sub string) string {
	if runtime.GOOS == "darwin" {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, "Library", "Application Support", "macfleet", sub)
		}
		return ""
	}
	if x := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "macfleet", sub)
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "macfleet", sub)
	}
	return ""
}

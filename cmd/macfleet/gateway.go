package main

import (
	goflag "flag"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/gateway/ledger"
	"github.com/macfleet/macfleet/gateway/peerfetch"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/internal/tracing"
)

func init() {
	root.AddCommand(newGatewayCmd())
}

// gatewayOptions are the flags of `macfleet gateway`: the gateway's Config, the flags
// resolved into it when the command runs, and the logger's.
type gatewayOptions struct {
	cfg        gateway.Config
	kubeconfig string
	routing    string
	peerFetch  bool
	zapOpts    zap.Options
}

func newGatewayCmd() *cobra.Command {
	var o gatewayOptions
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the fleet-wide OpenAI endpoint that routes requests to Ready replicas",
		Long: `Run the gateway: one OpenAI API for the whole fleet. It routes each request by its
"model" (a deployment's served name or alias, or "<namespace>/<name>") to a Ready
replica on a Ready Mac, balancing by least outstanding requests (optionally with
prefix affinity), retries another replica on a connect error, 503 or 507 before the
first byte, continues a Chat Completions stream whose replica fails after it on another
replica (see docs/fleet.md), queues requests fairly (per API key, interactive before batch) when every
replica is busy and answers 429 when the queue is full, holds requests while an OnDemand model cold-starts or an autoscaled
deployment is woken from zero replicas (see docs/autoscaling.md), and streams responses
through unbuffered. With --tls-cert-file and --tls-key-file it serves HTTPS itself (see
docs/security.md). GET /v1/models lists the deployments. The web console at /ui shows the Macs, the
models, the recent unloads and a chat playground (see docs/console.md). With
OTEL_EXPORTER_OTLP_ENDPOINT set it traces every request (see docs/tracing.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runGateway(cmd, &o) },
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// runGateway serves the gateway until SIGTERM, with tracing when OTEL_* asks for it.
func runGateway(cmd *cobra.Command, o *gatewayOptions) error {
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zapOpts)))
	cfg, err := o.config(cmd.Flags().Changed("routing"))
	if err != nil {
		return err
	}
	ctx := ctrl.SetupSignalHandler()
	tp, _, stop, err := startTracing(ctx, tracing.ServiceGateway, ctrl.Log.WithName("tracing"))
	if err != nil {
		return err
	}
	defer stop()
	cfg.TracerProvider = tp
	return gateway.Run(ctx, cfg)
}

// config is the gateway's Config from the flags: checked, with the REST config, the
// routing and peer fetch resolved; routingChanged says whether --routing was given.
func (o *gatewayOptions) config(routingChanged bool) (gateway.Config, error) {
	cfg := o.cfg
	if cfg.PeerFetchMargin <= 0 {
		return cfg, fmt.Errorf("--peer-fetch-margin must be positive (how many times faster than the prefill a fetch must be), got %v", cfg.PeerFetchMargin)
	}
	rc, err := restConfig(o.kubeconfig)
	if err != nil {
		return cfg, err
	}
	cfg.RestConfig = rc
	if cfg.Queue.ReserveSlots == 0 { // the flag's 0 is none; the Limits' 0 is the default
		cfg.Queue.ReserveSlots = -1
	}
	if cfg.Routing, err = gateway.ResolveRouting(o.routing, routingChanged, cfg.PrefixAffinity); err != nil {
		return cfg, err
	}
	cfg.DisablePeerFetch = !o.peerFetch
	if cfg.Queue.ActiveWindow <= 0 {
		return cfg, fmt.Errorf("--active-window must be positive, got %v", cfg.Queue.ActiveWindow)
	}
	return cfg, nil
}

// addFlags binds the gateway's flags to o.
func (o *gatewayOptions) addFlags(f *pflag.FlagSet) {
	cfg := &o.cfg
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig; default: $KUBECONFIG, then in-cluster")
	listenFlags(f, cfg)
	keyFlags(f, cfg)
	queueFlags(f, cfg)
	f.BoolVar(&cfg.DisableConsole, "disable-console", false,
		"Do not serve the web console at /ui (it uses the same API keys as the API)")
	f.StringVar(&cfg.GatewayID, "gateway-id", "",
		"This replica's name in its usage records (TokenUsage <id>.<YYYY-MM-DD> in each team's namespace); distinct per replica. Default: $POD_NAME, else the host name")
	f.DurationVar(&cfg.UsageRetention, "usage-retention", ledger.DefaultRetention,
		"How long the replica keeps its own usage records of past days before deleting them")
	routingFlags(f, cfg, &o.routing, &o.peerFetch)
	continuationFlags(f, cfg)
	f.DurationVar(&cfg.DrainTimeout, "drain-timeout", gateway.DefaultDrainTimeout,
		"On SIGTERM, /readyz fails at once and no new connection is taken; the requests in flight (streams, cold-start holds, the queue) "+
			"get this long to finish. Keep the pod's terminationGracePeriodSeconds above it (the chart derives it)")
	connectionFlags(f, &cfg.Limits)
	callerFlags(f, cfg)
	f.StringSliceVar(&cfg.AllowedHosts, "allowed-hosts", nil,
		"The only Host names the API and console answer to besides IP addresses and localhost (e.g. gateway.example.com, or .example.com "+
			"for every name under it); empty: any. Browsers' cross-origin requests are refused either way")
	gfs := goflag.NewFlagSet("zap", goflag.ContinueOnError)
	o.zapOpts.BindFlags(gfs)
	f.AddGoFlagSet(gfs)
}

// keyFlags are the flags of who may call the gateway: the certificate it shows the
// agents, the admin and tenant API keys, and ServiceAccount tokens.
func keyFlags(f *pflag.FlagSet, cfg *gateway.Config) {
	f.StringVar(&cfg.AgentCertSecret, "agent-cert-secret", mfv1.SystemNamespace+"/"+mfv1.GatewayTLSSecret, "Secret (namespace/name) with the client "+
		"certificate presented to agents and the fleet CA bundle, issued and renewed by the manager (re-read every 30s); \"\" calls agents over plain HTTP")
	f.StringVar(&cfg.TunnelListen, "tunnel-listen", "", "Address (host:port) that takes the mutual-TLS connections of agents that dial out "+
		"(macfleet agent --connect outbound --gateway-tunnel): requests for their Macs go through them (default: none)")
	f.StringSliceVar(&cfg.TunnelReplicas, "tunnel-replicas", nil, "With --tunnel-listen and several gateway replicas, the replicas' tunnel listeners (host:port, "+
		"a host standing for every address it resolves to, as a headless Service's name does): a Mac that dials out to another replica is reached through it (default: none)")
	f.StringVar(&cfg.APIKeysFile, "api-keys-file", "", "File of admin API keys (every namespace's models and the console), one per line, optionally followed by priority=batch (re-read when it changes)")
	f.BoolVar(&cfg.TenantKeys, "tenant-keys", false, "Accept the teams' API keys from Secrets of type macfleet.dev/api-key (as the manager publishes them in Secret macfleet-system/macfleet-api-keys, the only one the gateway reads besides its certificate), each reaching its namespace's models and those granted to it (spec.access); with this or --api-keys-file every request needs a key, with neither none does")
	f.StringVar(&cfg.TokenAudience, "token-audience", satoken.DefaultAudience,
		"With --tenant-keys, in-cluster callers may also send their ServiceAccount's token projected for this audience (checked by a TokenReview); it reaches what its namespace may use")
	f.BoolVar(&cfg.NoServiceAccountTokens, "no-service-account-tokens", false, "With --tenant-keys, accept API keys only, not ServiceAccount tokens")
	f.DurationVar(&cfg.TokenCacheTTL, "token-cache-ttl", satoken.DefaultTTL,
		"How long a ServiceAccount token's review is reused: the longest a deleted ServiceAccount's token keeps working")
}

// queueFlags are the flags of how requests wait: for a cold start, for a slot, in the
// deployments' fair queues.
func queueFlags(f *pflag.FlagSet, cfg *gateway.Config) {
	f.DurationVar(&cfg.ColdStartTimeout, "cold-start-timeout", gateway.DefaultColdStartTimeout,
		"How long a request waits for a routable replica (an OnDemand model loading, an autoscaled deployment woken from zero) before a 503")
	f.DurationVar(&cfg.StreamKeepAlive, "stream-keepalive", gateway.DefaultStreamKeepAlive,
		"Longest a held streaming request (queued, cold-starting, prefilling) stays silent: then a keep-alive event is sent "+
			"(an SSE comment; Anthropic's ping), so load balancers' idle timeouts do not cut it; the first commits status 200. Negative: none")
	f.IntVar(&cfg.MaxInFlightPerSlot, "max-inflight-per-slot", gateway.DefaultMaxInFlightPerSlot,
		"Requests sent to a replica at once per sequence slot of its engine (engine.parallel); more wait in the deployment's fair queue. "+
			"Negative: no limit and no queue (requests wait in the runners' own FIFO)")
	f.IntVar(&cfg.Queue.MaxQueued, "max-queue", fairqueue.DefaultMaxQueued,
		"Requests that may wait in one deployment's fair queue; more get a 429 with Retry-After")
	f.IntVar(&cfg.Queue.MaxPerFlow, "max-queue-per-key", 0,
		"Requests one client (API key, or address without keys) may have waiting in one deployment's queue; 0: a quarter of --max-queue")
	f.IntVar(&cfg.Queue.ReserveSlots, "reserve-slots", fairqueue.DefaultReserveSlots,
		"Slots of a deployment one client leaves to the others while more than one client is active, so a newcomer is served at once; 0 or negative: none")
	f.DurationVar(&cfg.Queue.ActiveWindow, "active-window", fairqueue.DefaultActiveWindow,
		"How long a client counts as active after its last request, for --reserve-slots: a client back within it finds a slot kept for it; "+
			"longer keeps the slot for clients with longer pauses, at the cost of a lone client's throughput for that long")
}

// listenFlags are the gateway's addresses and the API's TLS.
func listenFlags(f *pflag.FlagSet, cfg *gateway.Config) {
	f.StringVar(&cfg.Listen, "listen", ":8080", "Address of the OpenAI API")
	f.StringVar(&cfg.TLSCertFile, "tls-cert-file", "", "PEM certificate (with its chain) the API serves HTTPS with, TLS 1.2 or later; "+
		"re-read when it changes (e.g. a Secret mounted as files that an issuer renews). Needs --tls-key-file; unset: plain HTTP")
	f.StringVar(&cfg.TLSKeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file (re-read with it)")
	f.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":9090", `Address of the Prometheus /metrics endpoint; "0" disables it`)
	f.StringVar(&cfg.ProbeAddr, "health-probe-bind-address", ":8081", `Address of /healthz and /readyz; "0" disables them`)
}

// connectionFlags are the flags of the API's connection caps.
func connectionFlags(f *pflag.FlagSet, l *httpserver.Limits) {
	f.IntVar(&l.MaxConnections, "max-connections", httpserver.DefaultMaxConnections,
		"Connections the API holds open at once; the next one is answered 503 with Retry-After")
	f.IntVar(&l.MaxConnectionsPerSource, "max-connections-per-source", 0,
		"Connections the API holds open from one source address (an IPv6 /64) at once; the next one is answered 503 with Retry-After. "+
			"0: a quarter of --max-connections; negative: no cap per source (behind a proxy, whose address every client shares)")
}

// callerFlags are the flags of what the gateway believes of its callers: the issuer of
// their ServiceAccount tokens, and the proxies whose X-Forwarded-Proto the console
// trusts.
func callerFlags(f *pflag.FlagSet, cfg *gateway.Config) {
	f.StringVar(&cfg.TokenIssuer, "token-issuer", "", "The issuer a ServiceAccount token must name to be reviewed (default: the API server's, from its "+
		satoken.DiscoveryPath+"); tokens of another issuer are refused without a TokenReview")
	f.StringSliceVar(&cfg.TrustedProxies, "trusted-proxies", nil, "CIDRs of proxies (a TLS ingress) whose X-Forwarded-Proto: https the console believes, "+
		"making its session cookie Secure (a TLS connection always does)")
}

// continuationFlags are the flags of continuing a broken stream on another replica.
func continuationFlags(f *pflag.FlagSet, cfg *gateway.Config) {
	f.IntVar(&cfg.StreamContinuations, "stream-continuations", gateway.DefaultStreamContinuations,
		"How many times one Chat Completions stream whose replica fails after its first byte is continued on another replica, "+
			"spliced into the client's stream; negative: never (the stream ends with the error)")
	f.DurationVar(&cfg.ContinueTimeout, "stream-continue-timeout", gateway.DefaultContinueTimeout,
		"How long a broken stream waits for another replica to take its continuation before it ends with the error")
}

// routingFlags are the gateway's flags of how a replica is picked and of peer fetch.
func routingFlags(f *pflag.FlagSet, cfg *gateway.Config, routing *string, peerFetch *bool) {
	f.StringVar(routing, "routing", string(gateway.RoutingPrefixCache),
		"How a request's replica is picked: prefix-cache (the replica whose prompt cache holds the longest part of the conversation, "+
			"by the agents' prefix events, weighed by tier and load; with none holding any, and for deployments without a prompt "+
			"cache, least-load), prefix-affinity (consistent hashing of the conversation's start with bounded load) or least-load")
	f.BoolVar(peerFetch, "peer-fetch", true,
		"With --routing=prefix-cache: when a request goes to a replica that holds less of its prefix than a replica on another Mac, "+
			"have its agent fetch the prefix's state from that Mac first when that is estimated faster than prefilling it "+
			"(measured link throughput, bytes per token and prefill rate; see docs/prompt-cache.md), and warm a cold replica of a "+
			"deployment with spec.engine.promptCache.peerWarmup from its peers. false: always prefill, and no warm-up")
	f.Float64Var(&cfg.PeerFetchMargin, "peer-fetch-margin", peerfetch.DefaultMargin,
		"With --peer-fetch: how many times faster than the prefill a fetch must be estimated to be asked for")
	f.BoolVar(&cfg.PrefixAffinity, "prefix-affinity", false,
		"Same as --routing=prefix-affinity (kept for older command lines)")
}

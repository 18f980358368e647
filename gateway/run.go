package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/console"
	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/gateway/rebuild"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/internal/kubescheme"
)

// The gateway reads the fleet. It writes the wake annotation on an autoscaled
// ModelDeployment it holds requests for (see package wake), and its own usage records
// (TokenUsage, see budgets.go); the chart's macfleet-gateway-restriction policy keeps
// its identity to those.
// controller-gen generates its ClusterRole from these markers (roleName macfleet-gateway).
// +kubebuilder:rbac:groups=macfleet.dev,resources=modeldeployments;modelreplicas;macnodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modeldeployments,verbs=patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch
// The console's usage page reads the TokenUsage ledgers.
// +kubebuilder:rbac:groups=macfleet.dev,resources=tokenusages,verbs=get;list;watch

// Its client certificate for the agents (AgentCertSecret), by name: no other Secret.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get,resourceNames=macfleet-gateway-tls,namespace=macfleet-system

// With --tenant-keys, in-cluster callers' ServiceAccount tokens are checked by a
// TokenReview (package satoken).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create

// DefaultDrainTimeout is how long the requests in flight when the gateway is told to
// stop (streams, and requests held for a cold start or in the queue) may take to
// finish: the longest request a rollout lets finish. The chart's
// terminationGracePeriodSeconds is derived from it.
const DefaultDrainTimeout = 10 * time.Minute

// Config is everything `macfleet gateway` needs; cmd/macfleet fills it from flags.
type Config struct {
	RestConfig *rest.Config
	// Listen is the OpenAI API's address (ignored when Listener is set).
	Listen   string
	Listener net.Listener
	// TLSCertFile and TLSKeyFile, when set, make the API serve HTTPS (TLS 1.2 or
	// later) with that certificate and key, re-read when the files change and every
	// TLSPoll (DefaultTLSPoll when zero); unset, it serves plain HTTP.
	TLSCertFile string
	TLSKeyFile  string
	TLSPoll     time.Duration
	// MetricsAddr serves /metrics and ProbeAddr /healthz and /readyz; "" or "0"
	// disables one. MetricsListener and ProbeListener, when set, are served instead.
	MetricsAddr     string
	MetricsListener net.Listener
	ProbeAddr       string
	ProbeListener   net.Listener
	// AgentCertSecret ("namespace/name") holds the client certificate (tls.crt,
	// tls.key) the gateway presents to agents and the fleet CA bundle (ca.crt) their
	// certificates are checked against, issued and renewed by the manager and re-read
	// every AgentCertPoll. Empty calls agents over plain HTTP, which agents in cluster
	// mode refuse.
	AgentCertSecret string
	AgentCertPoll   time.Duration
	// TunnelListen, when set (TunnelListener instead, when that is), takes the
	// connections of agents that dial out (`macfleet agent --connect outbound`,
	// package tunnel) with the certificate of AgentCertSecret, which it needs.
	TunnelListen   string
	TunnelListener net.Listener
	// TunnelReplicas are the other gateway replicas' tunnel listeners (host:port; a
	// host stands for every address it resolves to): a Mac whose tunnel another
	// replica holds is reached through that replica (tunnel.Replicas).
	TunnelReplicas []string
	// FleetTokenFile, when set, holds a token sent to agents as a bearer key (re-read
	// when it changes): agents in cluster mode take certificates, not tokens; this
	// reaches agents that take a key (tests' standalone and fake agents).
	FleetTokenFile string
	// APIKeysFile holds the admin API keys (every namespace, the console); empty
	// means none.
	APIKeysFile string
	// TenantKeys accepts the teams' keys from Secrets of type tenancy.SecretType in
	// their namespaces, each scoped to what its namespace may use, as the manager
	// publishes them in the key index (controllers/apikeyindex): the gateway reads that
	// Secret, not the teams'. With it, or with an APIKeysFile, every request needs a
	// key; with neither, none does.
	TenantKeys bool
	// TokenAudience, with TenantKeys, also accepts in-cluster callers' ServiceAccount
	// tokens minted for this audience (satoken.DefaultAudience when empty), each the
	// identity of its ServiceAccount's namespace; NoServiceAccountTokens turns that
	// off. TokenCacheTTL bounds how long a review is reused (satoken.DefaultTTL).
	// TokenIssuer is the only issuer a token reviewed may name (empty: the API
	// server's, satoken.Issuer).
	TokenAudience          string
	TokenIssuer            string
	NoServiceAccountTokens bool
	TokenCacheTTL          time.Duration
	ColdStartTimeout       time.Duration
	// StreamKeepAlive: see Options.
	StreamKeepAlive time.Duration
	// StreamContinuations and ContinueTimeout: see Options.
	StreamContinuations int
	ContinueTimeout     time.Duration
	// MaxInFlightPerSlot and Queue: see Options.
	MaxInFlightPerSlot int
	Queue              fairqueue.Limits
	PrefixAffinity     bool
	// Routing: see Options.Routing (empty: by PrefixAffinity). NoInFlightPrefixes:
	// see Options.NoInFlightPrefixes.
	Routing            Routing
	NoInFlightPrefixes bool
	// DisablePeerFetch and PeerFetchMargin: see Options.
	DisablePeerFetch bool
	PeerFetchMargin  float64
	// DisableConsole turns off the web console at /ui (see package console).
	DisableConsole bool
	// TrustedProxies are CIDRs of proxies (a TLS ingress) whose X-Forwarded-Proto:
	// https the console believes: its session cookie is then Secure.
	TrustedProxies []string
	// FilePoll is how often the two files are checked for changes (DefaultFilePoll).
	FilePoll time.Duration
	// Registerer receives the gateway's metrics; nil means controller-runtime's
	// registry, which the metrics server serves.
	Registerer prometheus.Registerer
	// Started, when set, is called with the API's address once it listens.
	Started func(addr string)
	// TracerProvider traces requests (tracing.New); nil means none.
	TracerProvider trace.TracerProvider
	// GatewayID names this replica in its usage records (TokenUsage
	// <GatewayID>.<day>); "" means DefaultGatewayID. Replicas must have distinct ones.
	GatewayID string
	// UsageRetention is how long the replica keeps its usage records of past days
	// (ledger.DefaultRetention when zero).
	UsageRetention time.Duration
	// Limits bound the API's connections and request reads (httpserver's defaults
	// when zero); there is no write timeout, so streams run as long as they need.
	Limits httpserver.Limits
	// AllowedHosts, when set, are the only Host names the API and console answer to
	// besides IP addresses, localhost and the Listen host (httpserver.NewHosts); empty
	// means any Host. Browsers' cross-origin requests are refused either way.
	AllowedHosts []string
	// DrainTimeout (DefaultDrainTimeout when zero): once ctx ends, /readyz fails at
	// once, no new connection is accepted, and the requests in flight get this long
	// to finish before they are cut.
	DrainTimeout time.Duration
}

// DefaultGatewayID is $POD_NAME, else the host's name.
func DefaultGatewayID() string {
	if p := os.Getenv("POD_NAME"); p != "" {
		return p
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "gateway"
	}
	return strings.ToLower(h)
}

// Run serves the gateway until ctx ends: a controller-runtime manager (no leader
// election: every gateway replica serves) runs the informers, the table feeder, the
// API server, the metrics server and the probes. /readyz passes once the informers
// have synced and the first table is in place.
func Run(ctx context.Context, cfg Config) error {
	log := ctrl.LoggerFrom(ctx).WithName("gateway")
	w := &wiring{cfg: cfg, log: log, opts: Options{ColdStartTimeout: cfg.ColdStartTimeout, StreamKeepAlive: cfg.StreamKeepAlive, StreamContinuations: cfg.StreamContinuations, ContinueTimeout: cfg.ContinueTimeout, PrefixAffinity: cfg.PrefixAffinity,
		Routing: cfg.Routing, NoInFlightPrefixes: cfg.NoInFlightPrefixes, MaxInFlightPerSlot: cfg.MaxInFlightPerSlot, Queue: cfg.Queue, Registerer: cfg.Registerer, Log: log,
		TracerProvider: cfg.TracerProvider, DisablePeerFetch: cfg.DisablePeerFetch, PeerFetchMargin: cfg.PeerFetchMargin}}
	if w.opts.Registerer == nil {
		w.opts.Registerer = ctrlmetrics.Registry
	}
	if err := w.callers(); err != nil {
		return err
	}
	api, err := newAPIServer(cfg, w.opts.Registerer, log)
	if err != nil {
		return err
	}
	scheme, err := kubescheme.New()
	if err != nil {
		return err
	}
	writer, err := client.New(cfg.RestConfig, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating the client: %w", err)
	}
	w.opts.Wake = PatchWake(writer)
	if err := w.budgets(writer); err != nil {
		return err
	}
	g, err := New(w.opts)
	if err != nil {
		return err
	}
	defer g.Close()
	mgr, err := w.manager(scheme, api)
	if err != nil {
		return err
	}
	f, err := w.addRunnables(mgr, g, api)
	if err != nil {
		return err
	}
	if err := w.addProbes(mgr, api, f); err != nil {
		return err
	}
	// The options as New completed them with defaults.
	log.Info("Starting gateway", "listen", api.ln.Addr().String(), "tls", api.tls != nil, "drainTimeout", api.drainTimeout, "coldStartTimeout", g.opts.ColdStartTimeout,
		"routing", g.opts.Routing, "peerFetch", g.peers != nil, "apiKeys", cfg.APIKeysFile != "", "tenantKeys", cfg.TenantKeys, "console", !cfg.DisableConsole,
		"maxInFlightPerSlot", g.opts.MaxInFlightPerSlot, "budgets", w.lw != nil, "queue", cfg.Queue.WithDefaults(), "tracing", g.tracer != nil)
	return mgr.Start(ctx)
}

// PatchWake records a wake with a merge patch of the annotation alone: nothing else
// of the deployment is sent, so the write cannot undo another writer's change.
func PatchWake(c client.Client) WakeFunc {
	return func(ctx context.Context, namespace, name string, at time.Time) error {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			mfv1.AnnotationWakeRequested: at.UTC().Format(time.RFC3339Nano)}}})
		if err != nil {
			return err
		}
		md := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
		return c.Patch(ctx, md, client.RawPatch(types.MergePatchType, patch))
	}
}

// withConsole serves the web console under /ui beside the API. Its pages read the
// same informer cache as the routing table, scoped to the caller's key (identify, the
// gateway's own; nil when it has no client auth); its playground goes through g's
// handler, so it is authenticated, scoped and routed like any client.
func withConsole(g *Gateway, c cache.Cache, identify func(string) (tenancy.Identity, bool), proxies []string, log logr.Logger) (http.Handler, error) {
	trusted := make([]netip.Prefix, 0, len(proxies))
	for _, p := range proxies {
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("--trusted-proxies %q: want CIDRs such as 10.0.0.0/8: %w", p, err)
		}
		trusted = append(trusted, pfx)
	}
	ui, err := console.New(console.Options{TrustedProxies: trusted,
		Source: func(ctx context.Context) (console.Snapshot, error) {
			var (
				s   console.Snapshot
				mds mfv1.ModelDeploymentList
				mrs mfv1.ModelReplicaList
				mns mfv1.MacNodeList
			)
			for _, l := range []client.ObjectList{&mds, &mrs, &mns} {
				if err := c.List(ctx, l); err != nil {
					return s, fmt.Errorf("listing %T: %w", l, err)
				}
			}
			s.Deployments, s.Replicas, s.Nodes = mds.Items, mrs.Items, mns.Items
			s.Leases = nodeLeases(ctx, c, log)
			s.Traffic = make(map[string]console.Traffic, len(mds.Items))
			for _, d := range mds.Items {
				id := d.Namespace + "/" + d.Name
				t := g.Traffic(id)
				s.Traffic[id] = console.Traffic{RequestsPerSecond: t.RequestsPerSecond, TTFTp50: t.TTFTp50, TTFTp99: t.TTFTp99,
					TTFTSamples: t.TTFTSamples, InFlight: t.InFlight, Queued: t.Queued}
			}
			s.PromptCache = g.cacheStats.Read(ctx, mrs.Items)
			return s, nil
		},
		Usage: func(ctx context.Context) ([]mfv1.TokenUsage, error) {
			// The informer starts on the first usage page; a gateway that cannot read
			// the ledgers says so rather than hang the page.
			ctx, cancel := context.WithTimeout(ctx, usageWait)
			defer cancel()
			var l mfv1.TokenUsageList
			if err := c.List(ctx, &l); err != nil {
				return nil, fmt.Errorf("listing TokenUsages: %w", err)
			}
			return l.Items, nil
		},
		API:      g.Handler(),
		Identify: identify,
		Log:      log.WithName("console"),
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(console.Prefix+"/", ui)
	mux.Handle(console.Prefix, ui)
	mux.Handle("/", g.Handler())
	return mux, nil
}

// Feeder keeps a gateway's table in step with the informers: every add, update or
// delete of a ModelDeployment, ModelReplica or MacNode schedules a rebuild from the
// cache; bursts of events coalesce into one rebuild.
type Feeder struct {
	cache  cache.Cache
	g      *Gateway
	log    logr.Logger
	kick   chan struct{}
	synced atomic.Bool
}

// NewFeeder feeds g from c's informers once started (it is a manager Runnable).
func NewFeeder(c cache.Cache, g *Gateway, log logr.Logger) *Feeder {
	return &Feeder{cache: c, g: g, log: log, kick: make(chan struct{}, 1)}
}

// Synced reports whether a table built from synced informers is in place.
func (f *Feeder) Synced() bool { return f.synced.Load() }

func (f *Feeder) poke() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Start registers the event handlers, waits for the caches and rebuilds on every
// change until ctx ends.
func (f *Feeder) Start(ctx context.Context) error {
	h := toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { f.poke() },
		UpdateFunc: func(old, obj any) {
			if routing.Key(old) != routing.Key(obj) {
				f.poke()
			}
		},
		DeleteFunc: func(any) { f.poke() },
	}
	for _, obj := range []client.Object{&mfv1.ModelDeployment{}, &mfv1.ModelReplica{}, &mfv1.MacNode{}} {
		inf, err := f.cache.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("informer for %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("watching %T: %w", obj, err)
		}
	}
	if !f.cache.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	rebuild.Loop(ctx, f.kick, f.rebuild, func(err error) {
		f.log.Error(err, "Rebuilding the routing table; keeping the previous one")
	}, &f.synced)
	return nil
}

func (f *Feeder) rebuild(ctx context.Context) error {
	var (
		mds mfv1.ModelDeploymentList
		mrs mfv1.ModelReplicaList
		mns mfv1.MacNodeList
	)
	// The table only reads the objects: no copies of the cache's.
	for _, l := range []client.ObjectList{&mds, &mrs, &mns} {
		if err := f.cache.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return fmt.Errorf("listing %T: %w", l, err)
		}
	}
	t := BuildTable(mds.Items, mrs.Items, mns.Items)
	f.g.SetTable(t)
	if tunnels := f.g.opts.Tunnels; tunnels != nil {
		tunnels.SetLinks(splitLinks(mrs.Items))
	}
	if f.log.V(2).Enabled() {
		n := 0
		for _, rt := range t.Routes() {
			n += len(rt.Backends)
		}
		f.log.V(2).Info("Routing table rebuilt", "deployments", len(t.Routes()), "routableReplicas", n)
	}
	return nil
}

// leaseWait bounds the console's wait for the node Leases: their informer starts on
// the first page, and a gateway without the RBAC to read them still serves its pages.
const leaseWait = 2 * time.Second

// usageWait bounds the usage page's wait for the TokenUsage informer's first sync.
const usageWait = 10 * time.Second

// nodeLeases lists the agents' node Leases for the console; nil (the page shows no
// lease ages) when they cannot be read in time.
func nodeLeases(ctx context.Context, c cache.Cache, log logr.Logger) []coordinationv1.Lease {
	ctx, cancel := context.WithTimeout(ctx, leaseWait)
	defer cancel()
	var ls coordinationv1.LeaseList
	if err := c.List(ctx, &ls, client.InNamespace(mfv1.NodeLeaseNamespace)); err != nil {
		log.V(1).Info("Node Leases not read; the console shows no lease ages", "err", err.Error())
		return nil
	}
	return ls.Items
}

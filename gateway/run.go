package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/console"
	"github.com/macfleet/macfleet/fairqueue"
	"github.com/macfleet/macfleet/internal/callercert"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/internal/informers"
	"github.com/macfleet/macfleet/internal/mgrhttp"
	"github.com/macfleet/macfleet/ledger"
	"github.com/macfleet/macfleet/pki"
	"github.com/macfleet/macfleet/tenancy"
	"github.com/macfleet/macfleet/tenancy/satoken"
)

// The gateway reads the fleet. It writes the wake annotation on an autoscaled
// ModelDeployment it holds requests for (see waker), and its own usage records
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
	TokenAudience          string
	NoServiceAccountTokens bool
	TokenCacheTTL          time.Duration
	ColdStartTimeout       time.Duration
	// MaxInFlightPerSlot and Queue: see Options.
	MaxInFlightPerSlot int
	Queue              fairqueue.Limits
	PrefixAffinity     bool
	// DisableConsole turns off the web console at /ui (see package console).
	DisableConsole bool
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

// Scheme has the client-go and macfleet types.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := mfv1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Run serves the gateway until ctx ends: a controller-runtime manager (no leader
// election: every gateway replica serves) runs the informers, the table feeder, the
// API server, the metrics server and the probes. /readyz passes once the informers
// have synced and the first table is in place.
func Run(ctx context.Context, cfg Config) error {
	log := ctrl.LoggerFrom(ctx).WithName("gateway")
	w := &wiring{cfg: cfg, log: log, opts: Options{ColdStartTimeout: cfg.ColdStartTimeout, PrefixAffinity: cfg.PrefixAffinity,
		MaxInFlightPerSlot: cfg.MaxInFlightPerSlot, Queue: cfg.Queue, Registerer: cfg.Registerer, Log: log,
		TracerProvider: cfg.TracerProvider}}
	if w.opts.Registerer == nil {
		w.opts.Registerer = ctrlmetrics.Registry
	}
	if err := w.callers(); err != nil {
		return err
	}
	api, err := newAPIServer(cfg, log)
	if err != nil {
		return err
	}
	scheme, err := Scheme()
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
	log.Info("Starting gateway", "listen", api.ln.Addr().String(), "drainTimeout", api.drainTimeout, "coldStartTimeout", g.opts.ColdStartTimeout,
		"prefixAffinity", cfg.PrefixAffinity, "apiKeys", cfg.APIKeysFile != "", "tenantKeys", cfg.TenantKeys, "console", !cfg.DisableConsole,
		"maxInFlightPerSlot", g.opts.MaxInFlightPerSlot, "budgets", w.lw != nil, "queue", cfg.Queue.WithDefaults(), "tracing", g.tracer != nil)
	return mgr.Start(ctx)
}

// wiring is what Run assembles the gateway from, step by step.
type wiring struct {
	cfg  Config
	log  logr.Logger
	opts Options
	// watchers keep the credential files and Secrets read while the gateway runs.
	watchers []func(context.Context)
	kf       *KeysFile
	tk       *TenantKeys // set by addRunnables, once the cache exists
	lw       *ledger.Writer
}

// callers sets up how the gateway knows its callers and the agents: the agents'
// certificate, the fleet token, the API keys file, the teams' keys and ServiceAccount
// tokens.
func (w *wiring) callers() error {
	cfg, log := w.cfg, w.log
	if err := w.agentCertificates(); err != nil {
		return err
	}
	poll := cfg.FilePoll
	if poll <= 0 {
		poll = DefaultFilePoll
	}
	if cfg.FleetTokenFile != "" {
		tf, err := LoadTokenFile(cfg.FleetTokenFile)
		if err != nil {
			return fmt.Errorf("the fleet token: %w", err)
		}
		w.opts.FleetToken = tf.Token
		w.watchers = append(w.watchers, func(ctx context.Context) { tf.Watch(ctx, poll, log) })
	}
	if cfg.APIKeysFile != "" {
		kf, err := LoadKeysFile(cfg.APIKeysFile)
		if err != nil {
			return fmt.Errorf("the API keys: %w", err)
		}
		w.kf = kf
		w.watchers = append(w.watchers, func(ctx context.Context) { kf.Watch(ctx, poll, log) })
	}
	if w.kf != nil || cfg.TenantKeys {
		w.opts.Identify = w.identify
	}
	if cfg.TenantKeys && !cfg.NoServiceAccountTokens {
		cs, err := kubernetes.NewForConfig(cfg.RestConfig)
		if err != nil {
			return fmt.Errorf("creating the TokenReview client: %w", err)
		}
		rev, err := satoken.New(cs.AuthenticationV1().TokenReviews(), satoken.Options{Audience: cfg.TokenAudience, TTL: cfg.TokenCacheTTL,
			Registerer: w.opts.Registerer, Component: "gateway"})
		if err != nil {
			return err
		}
		w.opts.ReviewToken = rev.Review
		log.Info("Accepting ServiceAccount tokens", "audience", rev.Audience())
	}
	return nil
}

// agentCertificates keeps the certificate the gateway shows the agents read from its
// Secret, when there is one.
func (w *wiring) agentCertificates() error {
	cfg, log := w.cfg, w.log
	if cfg.AgentCertSecret == "" {
		log.Info("No --agent-cert-secret: requests reach agents over plain HTTP, which agents in cluster mode refuse")
		return nil
	}
	ns, name, ok := strings.Cut(cfg.AgentCertSecret, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("the agent certificate Secret %q: want namespace/name", cfg.AgentCertSecret)
	}
	cs, err := kubernetes.NewForConfig(cfg.RestConfig)
	if err != nil {
		return fmt.Errorf("creating the client of the agent certificate: %w", err)
	}
	certs := &pki.Source{}
	w.opts.AgentCertificates = certs
	w.watchers = append(w.watchers, func(ctx context.Context) {
		callercert.Keep(ctx, cs, ns, name, certs, cfg.AgentCertPoll, nil, log.WithName("agent-cert"))
	})
	return nil
}

// identify names the team of an API key: from the keys file, else the teams' keys.
func (w *wiring) identify(key string) (tenancy.Identity, bool) {
	if w.kf != nil {
		if id, ok := w.kf.Identify(key); ok {
			return id, true
		}
	}
	if w.tk != nil {
		return w.tk.Lookup(key)
	}
	return tenancy.Identity{}, false
}

// budgets counts the teams' callers in the ledger and holds them to their budgets.
func (w *wiring) budgets(writer client.Client) error {
	cfg := w.cfg
	if !cfg.TenantKeys {
		return nil
	}
	gid := cfg.GatewayID
	if gid == "" {
		gid = DefaultGatewayID()
	}
	if errs := validation.IsDNS1123Subdomain(ledger.RecordName(gid, time.Now())); len(errs) > 0 {
		return fmt.Errorf("the gateway id %q does not make a usage record's name: %s", gid, strings.Join(errs, "; "))
	}
	l := ledger.New(gid, clock.RealClock{})
	w.opts.Budgets = NewBudgets(l, nil, clock.RealClock{}, w.log.WithName("budgets"))
	w.lw = &ledger.Writer{Ledger: l, Client: writer, Retention: cfg.UsageRetention, Log: w.log.WithName("ledger")}
	return nil
}

// manager is the controller-runtime manager whose cache the gateway reads the fleet
// from.
func (w *wiring) manager(scheme *runtime.Scheme, api *apiServer) (manager.Manager, error) {
	byObject := map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{mfv1.NodeLeaseNamespace: {}}},
	}
	if w.cfg.TenantKeys {
		byObject[&corev1.Secret{}] = keyIndex()
	}
	mgr, err := ctrl.NewManager(w.cfg.RestConfig, ctrl.Options{
		Scheme: scheme,
		// The routing table catches up within a second of an API server outage's end.
		// The console shows how long ago each agent renewed its node Lease.
		Cache: cache.Options{NewInformer: informers.NewInformer(informers.Options{Log: w.log.WithName("informers")}),
			ByObject: byObject},
		// Probes and metrics are served on listeners of our own (mgrhttp).
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Logger:                 w.log,
		// The API server drains for up to DrainTimeout; the rest stops after it.
		GracefulShutdownTimeout: ptr.To(api.drainTimeout + time.Minute),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	return mgr, nil
}

// addRunnables adds to mgr what runs beside it: the table feeder, the teams' keys,
// the budgets and the ledger, the API server and the watchers.
func (w *wiring) addRunnables(mgr manager.Manager, g *Gateway, api *apiServer) (*Feeder, error) {
	f := NewFeeder(mgr.GetCache(), g, w.log)
	// The routing table and the usage ledger keep up while the requests in flight
	// drain: a request held for a cold start still finds the replica that comes up.
	if err := mgr.Add(api.untilDrained(f)); err != nil {
		return nil, err
	}
	if w.cfg.TenantKeys {
		w.tk = NewTenantKeys(mgr.GetCache(), w.log.WithName("keys"))
		if err := mgr.Add(w.tk); err != nil {
			return nil, err
		}
	}
	if w.lw != nil {
		w.opts.Budgets.cache, w.lw.Reader = mgr.GetCache(), mgr.GetCache()
		if err := mgr.Add(w.opts.Budgets); err != nil {
			return nil, err
		}
		if err := mgr.Add(api.untilDrained(w.lw)); err != nil {
			return nil, err
		}
	}
	handler := g.Handler()
	if !w.cfg.DisableConsole {
		var err error
		if handler, err = withConsole(g, mgr.GetCache(), w.opts.Identify, w.log); err != nil {
			return nil, err
		}
	}
	api.handler = httpserver.Guard(handler, api.hosts)
	if err := mgr.Add(api); err != nil {
		return nil, err
	}
	for _, watch := range w.watchers {
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { watch(ctx); return nil })); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// addProbes serves the probes and the metrics on their listeners: /readyz passes once
// the routing table, the teams' keys and the budgets have been read.
func (w *wiring) addProbes(mgr manager.Manager, api *apiServer, f *Feeder) error {
	cfg := w.cfg
	probeLn, err := mgrhttp.Listen(cfg.ProbeListener, cfg.ProbeAddr)
	if err != nil {
		return err
	}
	metricsLn, err := mgrhttp.Listen(cfg.MetricsListener, cfg.MetricsAddr)
	if err != nil {
		return err
	}
	return mgrhttp.Add(mgr, probeLn, mgrhttp.Probes{
		Healthz: map[string]healthz.Checker{"healthz": healthz.Ping},
		Readyz: map[string]healthz.Checker{"draining": api.notDraining, "table": func(*http.Request) error {
			if !f.Synced() {
				return errors.New("the routing table has not been built from synced informers yet")
			}
			if w.tk != nil && !w.tk.Synced() {
				return errors.New("the API key index (Secret macfleet-system/macfleet-api-keys, which the manager publishes) has not been read yet")
			}
			if w.lw != nil && (!w.opts.Budgets.Synced() || !w.lw.Restored()) {
				return errors.New("the TokenBudgets or this replica's usage records have not been read yet")
			}
			return nil
		}},
	}, metricsLn)
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
func withConsole(g *Gateway, c cache.Cache, identify func(string) (tenancy.Identity, bool), log logr.Logger) (http.Handler, error) {
	ui, err := console.New(console.Options{
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
			if routingKey(old) != routingKey(obj) {
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
	rebuildLoop(ctx, f.kick, f.rebuild, func(err error) {
		f.log.Error(err, "Rebuilding the routing table; keeping the previous one")
	}, &f.synced)
	return nil
}

// rebuildLoop runs rebuild once at once and then on every kick until ctx ends; a
// failed rebuild is reported and retried a second later. synced is set by the first
// rebuild that succeeds.
func rebuildLoop(ctx context.Context, kick <-chan struct{}, rebuild func(context.Context) error,
	failed func(error), synced *atomic.Bool) {
	retry := time.NewTimer(time.Second)
	retry.Stop() // armed only after a failure
	defer retry.Stop()
	for {
		if err := rebuild(ctx); err != nil {
			failed(err)
			retry.Reset(time.Second)
		} else {
			synced.Store(true)
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-retry.C:
		}
	}
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
	if f.log.V(2).Enabled() {
		n := 0
		for _, rt := range t.routes {
			n += len(rt.Backends)
		}
		f.log.V(2).Info("Routing table rebuilt", "deployments", len(t.routes), "routableReplicas", n)
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

package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/ledger"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/callercert"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/internal/informers"
	"github.com/macfleet/macfleet/internal/mgrhttp"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/tunnel"
)

// wiring is what Run assembles the gateway from, step by step.
type wiring struct {
	cfg  Config
	log  logr.Logger
	opts Options
	// watchers keep the credential files and Secrets read while the gateway runs.
	watchers []func(context.Context)
	kf       *KeysFile
	tk       *admission.TenantKeys // set by addRunnables, once the cache exists
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
		issuer := satoken.Issuer(context.Background(), cfg.TokenIssuer, cs.Discovery().RESTClient(), log)
		rev, err := satoken.New(cs.AuthenticationV1().TokenReviews(), satoken.Options{Audience: cfg.TokenAudience, Issuer: issuer,
			TTL: cfg.TokenCacheTTL, Registerer: w.opts.Registerer, Component: "gateway"})
		if err != nil {
			return err
		}
		w.opts.ReviewToken = rev.Review
		log.Info("Accepting ServiceAccount tokens", "audience", rev.Audience(), "issuer", issuer)
	}
	return nil
}

// agentCertificates keeps the certificate the gateway shows the agents read from its
// Secret, when there is one.
func (w *wiring) agentCertificates() error {
	cfg, log := w.cfg, w.log
	if cfg.AgentCertSecret == "" {
		if cfg.TunnelListen != "" || cfg.TunnelListener != nil {
			return errors.New("--tunnel-listen needs --agent-cert-secret: agents that dial out are checked against the fleet's CA")
		}
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
	certs, key := &pki.Source{}, &callercert.DigestKey{}
	w.opts.AgentCertificates, w.opts.PrefixDigestKey = certs, key.Get
	w.watchers = append(w.watchers, func(ctx context.Context) {
		callercert.Keep(ctx, cs, ns, name, certs, key, cfg.AgentCertPoll, nil, log.WithName("agent-cert"))
	})
	return w.tunnels(certs)
}

// tunnels takes the connections of agents that dial out on --tunnel-listen.
func (w *wiring) tunnels(certs *pki.Source) error {
	if err := tunnel.CheckReplicaAddrs(w.cfg.TunnelReplicas); err != nil {
		return fmt.Errorf("--tunnel-replicas: %w", err)
	}
	ln := w.cfg.TunnelListener
	if ln == nil && w.cfg.TunnelListen == "" {
		if len(w.cfg.TunnelReplicas) > 0 {
			return errors.New("--tunnel-replicas needs --tunnel-listen: the replicas reach each other's Macs through their tunnel listeners")
		}
		return nil
	}
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", w.cfg.TunnelListen); err != nil {
			return fmt.Errorf("the tunnel listener (--tunnel-listen): %w", err)
		}
	}
	t := &tunnel.Sessions{Certificates: certs, Log: w.log.WithName("tunnel")}
	w.opts.Tunnels = t
	w.log.Info("Taking the connections of agents that dial out", "tunnelListen", ln.Addr().String())
	w.watchers = append(w.watchers, func(ctx context.Context) {
		if err := t.Serve(ctx, ln); err != nil {
			w.log.Error(err, "Serving the tunnels")
		}
	})
	if len(w.cfg.TunnelReplicas) > 0 {
		t.Replicas = &tunnel.Replicas{Addrs: w.cfg.TunnelReplicas, Certificates: certs, Log: w.log.WithName("tunnel-replicas")}
		w.log.Info("Reaching the Macs that dial out to other gateway replicas through them", "tunnelReplicas", w.cfg.TunnelReplicas)
		w.watchers = append(w.watchers, t.Replicas.Run)
	}
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
	w.opts.Budgets = admission.NewBudgets(l, nil, clock.RealClock{}, w.log.WithName("budgets"))
	w.opts.Budgets.LeaseWith(gid, writer)
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
		byObject[&corev1.Secret{}] = admission.KeyIndex()
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
		w.tk = admission.NewTenantKeys(mgr.GetCache(), w.log.WithName("keys"))
		if err := mgr.Add(w.tk); err != nil {
			return nil, err
		}
	}
	if w.lw != nil {
		w.opts.Budgets.Follow(mgr.GetCache())
		w.lw.Reader = mgr.GetCache()
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
		if handler, err = withConsole(g, mgr.GetCache(), w.opts.Identify, w.cfg.TrustedProxies, w.log); err != nil {
			return nil, err
		}
	}
	api.handler = httpserver.Guard(handler, api.hosts)
	if err := mgr.Add(api); err != nil {
		return nil, err
	}
	if api.tls != nil {
		if err := mgr.Add(api.tls.watcher); err != nil {
			return nil, err
		}
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

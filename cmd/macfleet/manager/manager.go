// Package manager runs the macfleet control plane: the modeldeployment, scheduler,
// macnode, endpoints, fleetquota, autoscaler, certsigner and apikeyindex controllers
// in one controller-runtime manager with leader election, health probes and
// Prometheus metrics.
package manager

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/macfleet/macfleet/agent/hubtoken"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/apikeyindex"
	"github.com/macfleet/macfleet/controllers/autoscaler"
	"github.com/macfleet/macfleet/controllers/certsigner"
	"github.com/macfleet/macfleet/controllers/endpoints"
	"github.com/macfleet/macfleet/controllers/endpoints/addressproof"
	"github.com/macfleet/macfleet/controllers/fleetquota"
	"github.com/macfleet/macfleet/controllers/macnode"
	"github.com/macfleet/macfleet/controllers/modeldeployment"
	"github.com/macfleet/macfleet/controllers/scheduler"
	"github.com/macfleet/macfleet/internal/informers"
	"github.com/macfleet/macfleet/internal/kubescheme"
	"github.com/macfleet/macfleet/internal/mgrhttp"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/nodeauthz"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/tunnel"
)

// Config is everything the manager needs; cmd/macfleet fills it from flags.
type Config struct {
	// RestConfig reaches the API server.
	RestConfig *rest.Config
	// MetricsAddr serves /metrics; "" or "0" disables it. MetricsListener, when set, is
	// served instead.
	MetricsAddr     string
	MetricsListener net.Listener
	// ProbeAddr serves /healthz and /readyz; "" or "0" disables it. ProbeListener, when
	// set, is served instead.
	ProbeAddr     string
	ProbeListener net.Listener
	// LeaderElection makes only one manager replica act at a time.
	LeaderElection bool
	// LeaderElectionNamespace holds the election Lease; empty means the namespace the
	// manager runs in (in cluster).
	LeaderElectionNamespace string
	// NodeLossGrace is how long a Mac's Lease stays expired before its replicas are
	// rescheduled elsewhere.
	NodeLossGrace time.Duration
	// SchedulerWorkers is how many binding writes run in parallel.
	SchedulerWorkers int
	// Resolver maps hf:// and ollama:// sources to URLs for the memory estimate.
	Resolver modelsource.Resolver
	// GatewayIdentity names the gateway's identity (macfleet://gateway/<name>) whose
	// client certificate the manager issues and renews in Secret
	// macfleet-system/macfleet-gateway-tls; "" issues none. The manager keeps the fleet
	// CA, signs the agents' certificates and reads their load with a certificate of its
	// own (controllers/certsigner).
	GatewayIdentity string
	// MetricsIdentity names the identity of the scraper of the agents' /metrics
	// (macfleet://metrics/<name>: /metrics only) whose client certificate the manager
	// issues and renews in Secret macfleet-system/macfleet-metrics-tls; "" issues none.
	MetricsIdentity string
	// GatewayServingSecret, when set, is a kubernetes.io/tls Secret of macfleet-system
	// in which the manager keeps a serving certificate from the fleet CA for
	// GatewayServingHosts, for the gateway's own HTTPS listener where no other issuer
	// serves the cluster.
	GatewayServingSecret string
	GatewayServingHosts  []string
	// AgentHTTP, when set, reaches the agents instead of per-Mac HTTPS transports with
	// the manager's certificate (tests' fake agents over plain HTTP).
	AgentHTTP *http.Client
	// GatewayTunnel, when set, is the tunnel listener (host:port) of the gateway that
	// Macs dial out to: the manager reads such a Mac's agent through it (package
	// tunnel, Relay), any other Mac's at its address.
	GatewayTunnel string
	// AutoscalerInterval is how often an autoscaled deployment's load is measured;
	// 0 means autoscaler.DefaultInterval.
	AutoscalerInterval time.Duration
	// NodeAuthorizerAddr serves the node authorizer webhook (internal/nodeauthz) over
	// HTTPS with the certificate in NodeAuthorizerCertDir; "" or "0" disables it.
	// NodeAuthorizerListener, when set, is served instead.
	NodeAuthorizerAddr     string
	NodeAuthorizerListener net.Listener
	NodeAuthorizerCertDir  string
	// NodeAuthorizerClientCA, when set, is the PEM file of the CAs that sign the
	// client certificate the API server presents to the webhook; callers without one
	// are refused.
	NodeAuthorizerClientCA string
	// SkipNameValidation lets one process build several managers (tests do).
	SkipNameValidation bool
}

// The election Lease lives in the manager's namespace (the chart's macfleet-system).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete,namespace=macfleet-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch,namespace=macfleet-system
// The node authorization preflight asks what a Mac may read (nodeauthz.Preflight).
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// LeaderElectionID names the election Lease.
const LeaderElectionID = "macfleet-manager.macfleet.dev"

// New builds the manager with every controller set up, ready to Start.
func New(cfg Config) (ctrl.Manager, error) {
	if err := checkServing(cfg.GatewayServingSecret, cfg.GatewayServingHosts); err != nil {
		return nil, err
	}
	scheme, err := kubescheme.New()
	if err != nil {
		return nil, fmt.Errorf("building the scheme: %w", err)
	}
	// The scheduler writes two objects per binding; the client's default 20 QPS would
	// take ~100 s to place 1,000 replicas.
	rc := rest.CopyConfig(cfg.RestConfig)
	if rc.QPS == 0 {
		rc.QPS, rc.Burst = 200, 400
	}
	// The informers tell the macnode controller when the manager itself lost the API
	// server, so that it does not call every Mac lost when it returns.
	contact := &informers.Contact{}
	mgr, err := newControllerManager(cfg, rc, scheme, contact)
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	if err := setupReconcilers(mgr, cfg, rc, scheme, contact); err != nil {
		return nil, err
	}
	if err := addServers(mgr, cfg); err != nil {
		return nil, err
	}
	return mgr, nil
}

// newControllerManager creates the controller-runtime manager: leader election, no
// servers of its own, and a cache of only what macfleet reads.
func newControllerManager(cfg Config, rc *rest.Config, scheme *runtime.Scheme, contact *informers.Contact) (ctrl.Manager, error) {
	return ctrl.NewManager(rc, ctrl.Options{
		Scheme: scheme,
		// Probes and metrics are served on listeners of our own (mgrhttp).
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                cfg.LeaderElection,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionNamespace:       cfg.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		Controller:                    config.Controller{SkipNameValidation: &cfg.SkipNameValidation},
		// Cache only the Leases, Services and EndpointSlices that are macfleet's, and
		// the teams' key Secrets redacted; the informers catch up within a second of an
		// API server outage's end.
		Cache: cache.Options{NewInformer: informers.NewInformer(informers.Options{Log: ctrl.Log.WithName("informers"), Contact: contact}), ByObject: maps.Collect(func(yield func(client.Object, cache.ByObject) bool) {
			for _, m := range []map[client.Object]cache.ByObject{macnode.CacheByObject(), endpoints.CacheByObject(), apikeyindex.CacheByObject()} {
				for k, v := range m {
					if !yield(k, v) {
						return
					}
				}
			}
		})},
	})
}

// setupReconcilers adds the fleet CA and every controller to mgr.
func setupReconcilers(mgr ctrl.Manager, cfg Config, rc *rest.Config, scheme *runtime.Scheme, contact *informers.Contact) error {
	// The fleet CA (read and written directly: the manager caches no Secret).
	direct, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	authority := &certsigner.Authority{Client: direct, Self: &pki.Source{}, GatewayName: cfg.GatewayIdentity,
		MetricsName: cfg.MetricsIdentity, GatewayServingSecret: cfg.GatewayServingSecret, GatewayServingHosts: cfg.GatewayServingHosts,
		Log: ctrl.Log.WithName("certsigner")}
	if err := mgr.Add(authority); err != nil {
		return err
	}
	agents := &autoscaler.AgentSource{Client: mgr.GetClient(), Certificates: authority.Self}
	if cfg.GatewayTunnel != "" {
		relay := &tunnel.Relay{Gateway: cfg.GatewayTunnel, Certificates: authority.Self}
		agents.HTTP = &http.Client{Timeout: autoscaler.DefaultAgentTimeout, Transport: relay.Transports()}
	}
	if cfg.AgentHTTP != nil {
		agents = &autoscaler.AgentSource{Client: mgr.GetClient(), HTTP: cfg.AgentHTTP}
	}
	// The fleet's hub token, with which the estimates read gated hf:// repositories
	// (read directly, at most once a minute: the manager caches no Secret).
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	hub := &hubtoken.Source{Clientset: cs, Log: ctrl.Log.WithName("hubtoken")}
	resolver := cfg.Resolver
	reconcilers := []interface{ SetupWithManager(ctrl.Manager) error }{
		&modeldeployment.Reconciler{Resolver: &resolver, HubToken: hub.Token},
		&scheduler.Reconciler{Workers: cfg.SchedulerWorkers},
		&macnode.Reconciler{NodeLossGrace: cfg.NodeLossGrace, Contact: contact},
		&endpoints.Reconciler{Addresses: &addressproof.Prober{Source: authority.Self}},
		&fleetquota.Reconciler{},
		&autoscaler.Reconciler{Interval: cfg.AutoscalerInterval, Source: agents},
		&certsigner.Signer{Authority: authority},
		&certsigner.BundlePublisher{Client: direct, Authority: authority},
		&apikeyindex.Publisher{Client: direct},
	}
	for _, r := range reconcilers {
		if err := r.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up %T: %w", r, err)
		}
	}
	return nil
}

// addServers adds the probe, metrics and node authorizer servers on their listeners;
// when one cannot be set up, the listeners already opened are closed.
func addServers(mgr ctrl.Manager, cfg Config) error {
	probes := mgrhttp.Probes{
		Healthz: map[string]healthz.Checker{"healthz": healthz.Ping},
		Readyz: map[string]healthz.Checker{"readyz": func(req *http.Request) error {
			if !mgr.GetCache().WaitForCacheSync(req.Context()) {
				return fmt.Errorf("informer caches are not synced")
			}
			return nil
		}},
	}
	probeLn, err := mgrhttp.Listen(cfg.ProbeListener, cfg.ProbeAddr)
	if err != nil {
		return err
	}
	metricsLn, err := mgrhttp.Listen(cfg.MetricsListener, cfg.MetricsAddr)
	if err == nil {
		err = mgrhttp.Add(mgr, probeLn, probes, metricsLn)
	}
	var authzLn net.Listener
	if err == nil {
		authzLn, err = mgrhttp.Listen(cfg.NodeAuthorizerListener, cfg.NodeAuthorizerAddr)
	}
	if err == nil && authzLn != nil {
		if cfg.NodeAuthorizerCertDir == "" {
			err = fmt.Errorf("the node authorizer on %s needs a certificate: set --node-authorizer-cert-dir to a directory with tls.crt and tls.key", authzLn.Addr())
		} else {
			err = nodeauthz.Add(mgr, nodeauthz.Options{Listener: authzLn, CertDir: cfg.NodeAuthorizerCertDir,
				ClientCAFile: cfg.NodeAuthorizerClientCA})
		}
	}
	if err == nil {
		err = nodeauthz.AddPreflight(mgr, authzLn != nil)
	}
	if err != nil {
		for _, ln := range []net.Listener{probeLn, metricsLn, authzLn} {
			if ln != nil {
				ln.Close()
			}
		}
		return err
	}
	return nil
}

// Run builds the manager and runs it until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	mgr, err := New(cfg)
	if err != nil {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("Starting manager", "leaderElection", cfg.LeaderElection, "nodeLossGrace", cfg.NodeLossGrace)
	return mgr.Start(ctx)
}

// checkServing refuses a gateway serving Secret that would overwrite one the manager
// keeps for something else, or whose hosts no certificate can name.
func checkServing(secret string, hosts []string) error {
	switch {
	case secret == "" && len(hosts) > 0:
		return errors.New("--gateway-serving-hosts needs --gateway-serving-secret: the Secret to keep their certificate in")
	case secret == "":
		return nil
	case slices.Contains([]string{mfv1.CASecret, mfv1.GatewayTLSSecret, mfv1.MetricsTLSSecret, mfv1.APIKeyIndexSecret, mfv1.FleetTokenSecret}, secret):
		return fmt.Errorf("--gateway-serving-secret %s is a Secret the manager keeps for something else: name another", secret)
	}
	if err := pki.ValidHosts(hosts); err != nil {
		return fmt.Errorf("--gateway-serving-hosts: %w", err)
	}
	return nil
}

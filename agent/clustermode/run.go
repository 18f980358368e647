// Package clustermode runs the node agent in cluster mode (`macfleet agent`): it watches
// the ModelReplicas bound to its MacNode, drives its engine pool through an explicit
// transition table (table.go), downloads models through the store, reports each
// replica's status, and serves the OpenAI + admin API to the gateway and the
// per-deployment Services over TLS with a certificate of its own (agent/certs): the
// gateways and the manager present theirs, tenants a ServiceAccount token. The API
// server is never on the request path: the agent keeps serving while it is
// unreachable and resyncs when it returns.
package clustermode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/certs"
	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/devicegauge"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/internal/informers"
	"github.com/macfleet/macfleet/internal/kubescheme"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
	"github.com/macfleet/macfleet/internal/tunnel"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// DefaultShutdownTimeout bounds a graceful shutdown: draining requests and unloading
// every model.
const DefaultShutdownTimeout = 90 * time.Second

// Env is what the agent's other loops (MacNode registration, Lease, memory status)
// share with the replica sync.
type Env struct {
	NodeName string
	// Endpoint is the advertised host:port of the agent's API.
	Endpoint string
	Pool     *enginepool.Pool
	// Client reads and writes the API server directly (no cache).
	Client client.Client
	// Ready reports whether the agent has synced its replicas.
	Ready func() bool
}

// Runnable is a loop that runs beside the agent until ctx ends. An error stops the
// agent.
type Runnable func(ctx context.Context, env Env) error

// Config is the agent's configuration.
type Config struct {
	// RestConfig reaches the API server with the node's credential.
	RestConfig *rest.Config
	NodeName   string
	// Listen is the API's address (":8080"); Listener, when set, is served instead.
	Listen   string
	Listener net.Listener
	// AdvertiseAddress is host:port written into replica status; empty means the
	// first non-loopback IPv4 address with the listen port, and port 0 the listen
	// port (which a listen address with port 0 leaves to the kernel).
	AdvertiseAddress string
	// GatewayTunnel, when set, is the gateway's tunnel listener (host:port): the agent
	// dials it and serves its API through that connection too (package tunnel), for a
	// Mac the fleet cannot reach at its advertised address.
	GatewayTunnel string
	// ConnectAuto holds that connection only while the gateway's probe does not
	// reach the agent at its advertised address (--connect auto).
	ConnectAuto bool
	// TunnelProbeInterval is how often an agent of --connect auto probes again while
	// the gateway reaches it (tunnel.ProbeInterval when zero).
	TunnelProbeInterval time.Duration
	// The API is served over TLS with the node's certificate, which the agent asks for
	// with a CertificateSigningRequest and renews (agent/certs); Certificates, when
	// set, is used as it is instead (its holder keeps it current). Every call but
	// /healthz and /readyz needs the client certificate of a gateway or the manager
	// (the whole API) or a ServiceAccount token (below). CertificateLifetime is the
	// lifetime asked for (pki.DefaultLeafLifetime when zero).
	Certificates        *pki.Source
	CertificateLifetime time.Duration
	// TokenAudience: the OpenAI API also takes in-cluster callers' ServiceAccount
	// tokens projected for this audience (satoken.DefaultAudience when empty),
	// checked by a TokenReview with the node's credential; each reaches the replicas
	// of its namespace and of deployments whose spec.access grants it. The admin API
	// takes only a gateway's or the manager's certificate. NoServiceAccountTokens turns them off;
	// TokenCacheTTL bounds how long a review is reused (satoken.DefaultTTL).
	// TokenIssuer is the only issuer a token reviewed may name (empty: the API
	// server's, satoken.Issuer).
	TokenAudience          string
	TokenIssuer            string
	NoServiceAccountTokens bool
	TokenCacheTTL          time.Duration
	Store                  Store
	// SourcePolicy, when set, is kept at the cluster's SourcePolicy "default" (the
	// built-in default while there is none), and replicas are fetched only once it is
	// known. Give the store the same holder so that its downloads follow the policy.
	SourcePolicy *sourcepolicy.Holder
	// RunnerPath: see runnerproc.ProcessConfig.RunnerPath. RunnerThreads are the threads of
	// runners whose replica sets none (zero: the thread policy, engine.PolicyThreads).
	// RunnerOutput, when set, receives every runner's output lines.
	RunnerPath    string
	RunnerThreads int
	RunnerOutput  io.Writer
	// RunnerSandbox: see runnerproc.ProcessConfig.Sandbox (empty: on).
	// AllowUnconfinedRunners: see runnerproc.ProcessConfig.AllowUnconfined.
	RunnerSandbox          sandbox.Mode
	AllowUnconfinedRunners bool
	// SocketDir holds the runners' sockets (runnerproc.ProcessConfig.SocketDir).
	SocketDir string
	// StateDir, when set, is the agent's own state directory: its TLS key is kept in
	// KeyFile(StateDir) (the key pinned to the Mac: agent/certs), and runners
	// are recorded in StateDir/runners so that the next agent adopts the ones an earlier agent
	// left (KeepRunners, or a crash) whose replica and engine are unchanged instead of
	// reloading them; the ones no replica claims are stopped after the first sync.
	StateDir string
	// KeepRunners leaves the runners of loaded models running when the agent stops
	// (needs StateDir); otherwise every model is unloaded on exit.
	KeepRunners bool
	// PromptCacheDir is the root of the prompt cache's SSD tier (a directory per model
	// file below it, found again after a restart); empty: no SSD tier.
	// PromptCacheSSDBytes is the SSD quota of each model of each namespace (its
	// replicas here share one directory) and the most its deployment may ask for (0:
	// no SSD tier). The hot budget is Pool.PromptCacheHotBytes.
	PromptCacheDir      string
	PromptCacheSSDBytes int64
	// Pool tunes the engine pool (ceiling, reserve, timeouts, prompt cache hot budget).
	Pool enginepool.Config
	// TracerProvider traces the OpenAI requests (tracing.New); nil means none.
	TracerProvider trace.TracerProvider
	// SpanRelay exports the runners' spans, which they hand to the agent
	// (runnerproc.ProcessConfig.SpanRelay; tracing.Provider.RunnerRelay); nil: runners make
	// none.
	SpanRelay *spanrelay.Forwarder
	// Gauge measures memory; nil means enginepool.NewGauge().
	Gauge enginepool.Gauge
	// Runnables run beside the agent (node registration, Lease).
	Runnables []Runnable
	// Syncer tunes the replica sync (periods, backoffs); the rest of its options
	// come from here.
	Syncer SyncerOptions
	// Janitor removes the store's files no replica needs (when Store implements
	// janitor.StorePruner) and the prompt cache directories of models gone; it is off when
	// both its retentions are zero.
	Janitor         janitor.Options
	ShutdownTimeout time.Duration
	Log             logr.Logger
	// Started, when set, is called with the address served and the endpoint advertised.
	Started func(addr, endpoint string)
}

// KeyFile is where an agent with the state directory stateDir keeps its TLS key.
func KeyFile(stateDir string) string { return filepath.Join(stateDir, "identity", "node.key") }

// Run runs the agent until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Log
	if cfg.RestConfig == nil || cfg.NodeName == "" || cfg.Store == nil {
		return errors.New("cluster: the agent needs a rest config, a node name and a store")
	}
	rc := rest.CopyConfig(cfg.RestConfig)
	if rc.QPS == 0 {
		rc.QPS, rc.Burst = 20, 40
	}
	w, err := watchReplicas(ctx, rc, cfg)
	if err != nil {
		return err
	}
	pcfg := runnerproc.ProcessConfig{RunnerPath: cfg.RunnerPath, Threads: cfg.RunnerThreads, SocketDir: cfg.SocketDir,
		Sandbox: cfg.RunnerSandbox, AllowUnconfined: cfg.AllowUnconfinedRunners, Log: log.WithName("runner"), Output: cfg.RunnerOutput,
		PromptCacheDir: cfg.PromptCacheDir, PromptCacheSSDBytes: cfg.PromptCacheSSDBytes, SpanRelay: cfg.SpanRelay}
	poolCfg := cfg.Pool
	if cfg.StateDir != "" {
		pcfg.StateDir = filepath.Join(cfg.StateDir, "runners")
		poolCfg.KeepRunnersOnExit = cfg.KeepRunners
	}
	eng, err := standalone.NewEngine(pcfg, poolCfg, cfg.Gauge, log)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating the API clientset: %w", err)
	}
	tlsSrc, keeper := certificates(cfg, cs)
	ln, endpoint, err := listen(cfg, tlsSrc)
	if err != nil {
		return err
	}
	out := outbound(cfg, tlsSrc, endpoint)
	a, err := newAgent(cfg, cs, w, eng, endpoint, tlsSrc, keeper, out)
	if err != nil {
		ln.Close()
		return err
	}
	httpSrv := httpserver.New(a.srv.Handler(), httpserver.Limits{})

	// The pool outlives ctx: it unloads everything on shutdown, after the HTTP
	// server stopped taking requests.
	poolCtx, stopPool := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPool()
	poolDone := make(chan error, 1)
	go func() { poolDone <- eng.Pool.Run(poolCtx) }()
	serveDone := make(chan error, 1)
	go func() { serveDone <- httpSrv.Serve(ln) }()
	dialOut(ctx, cfg, out, tlsSrc, keeper, httpSrv)
	log.Info("Serving the OpenAI and admin API", "addr", ln.Addr().String(), "endpoint", endpoint, "node", cfg.NodeName,
		"runner", eng.RunnerPath, "ceiling", eng.Pool.Ceiling().Describe())
	if cfg.Started != nil {
		cfg.Started(ln.Addr().String(), endpoint)
	}

	runErr := a.run(ctx, cfg, keeper, serveDone)
	if errors.Is(runErr, context.Canceled) {
		runErr = nil
	}
	timeout := cfg.ShutdownTimeout
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	log.Info("Shutting down: draining requests and unloading models", "timeout", timeout)
	err = errors.Join(runErr, a.srv.Shutdown(httpSrv, stopPool, poolDone, timeout))
	if err == nil {
		log.Info("Stopped")
	}
	return err
}

// replicaWatch is the agent's view of the API: a direct client, the cache of the
// ModelReplicas bound to its node (and the SourcePolicy), and their informer.
type replicaWatch struct {
	direct client.Client
	cache  cache.Cache
	// shards are the replicas with a worker shard on this Mac.
	shards       *workerShards
	informer     toolscache.SharedIndexInformer
	policySynced func() bool
}

// watchReplicas makes the clients and the replica cache (not started).
func watchReplicas(ctx context.Context, rc *rest.Config, cfg Config) (*replicaWatch, error) {
	log := cfg.Log
	scheme, err := kubescheme.New()
	if err != nil {
		return nil, err
	}
	w := &replicaWatch{policySynced: func() bool { return true }}
	if w.direct, err = client.New(rc, client.Options{Scheme: scheme}); err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	// The replica informer catches up within a second of an API server outage's end.
	w.cache, err = cache.New(rc, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{
		&v1alpha1.ModelReplica{}: {Field: fields.OneTermEqualSelector(v1alpha1.ReplicaNodeNameField, cfg.NodeName)},
	}, NewInformer: informers.NewInformer(informers.Options{Log: log.WithName("informers")})})
	if err != nil {
		return nil, fmt.Errorf("creating the replica cache: %w", err)
	}
	if w.shards, err = watchWorkerShards(rc, scheme, cfg.NodeName, log.WithName("informers")); err != nil {
		return nil, err
	}
	inf, err := w.cache.GetInformer(ctx, &v1alpha1.ModelReplica{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("watching replicas: %w", err)
	}
	var ok bool
	if w.informer, ok = inf.(toolscache.SharedIndexInformer); !ok {
		return nil, fmt.Errorf("the replica informer is a %T, not a shared index informer", inf)
	}
	if cfg.SourcePolicy != nil {
		if w.policySynced, err = watchSourcePolicy(ctx, w.cache, cfg.SourcePolicy, log.WithName("sourcepolicy")); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// certificates is the source of the agent's serving certificate: cfg's, else a
// keeper that asks the manager for one (nil keeper with cfg's).
func certificates(cfg Config, cs kubernetes.Interface) (*pki.Source, *certs.Keeper) {
	if cfg.Certificates != nil {
		return cfg.Certificates, nil
	}
	src := &pki.Source{}
	keyFile := "" // without a state directory the key lives as long as the agent
	if cfg.StateDir != "" {
		keyFile = KeyFile(cfg.StateDir)
	}
	return src, certs.New(certs.Options{Clientset: cs, NodeName: cfg.NodeName, Source: src, KeyFile: keyFile,
		Lifetime: cfg.CertificateLifetime, Log: cfg.Log.WithName("certs")})
}

// listen opens the TLS listener and works out the advertised endpoint.
func listen(cfg Config, tlsSrc *pki.Source) (net.Listener, string, error) {
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
			return nil, "", fmt.Errorf("listening on %s: %w", cfg.Listen, err)
		}
	}
	// The connection cap wraps the TCP listener, beneath TLS; TLS only: a caller that
	// speaks plain HTTP gets no answer.
	ln = tls.NewListener(httpserver.Listener(ln, httpserver.Limits{}), tlsSrc.ServerConfig())
	endpoint := cfg.AdvertiseAddress
	if endpoint == "" {
		var err error
		if endpoint, err = DefaultAdvertiseAddress(ln.Addr().String()); err != nil {
			ln.Close()
			return nil, "", err
		}
	} else if host, port, err := net.SplitHostPort(endpoint); err == nil && port == "0" {
		_, lport, _ := net.SplitHostPort(ln.Addr().String())
		endpoint = net.JoinHostPort(host, lport)
	}
	return ln, endpoint, nil
}

// agent is the running agent's parts: the replica sync, the HTTP server, the janitor.
type agent struct {
	log      logr.Logger
	w        *replicaWatch
	eng      *standalone.Engine
	endpoint string
	syncer   *Syncer
	peers    *SplitLinks
	srv      *server.Server
	jan      *janitor.Janitor
}

// newAgent builds the syncer (adopting the runners an earlier agent recorded), the
// HTTP server with its token review, and the janitor. With a keeper (the agent asks
// for its own certificate), no replica is reported Ready before it holds one.
func newAgent(cfg Config, cs kubernetes.Interface, w *replicaWatch, eng *standalone.Engine, endpoint string, tlsSrc *pki.Source,
	keeper *certs.Keeper, out *tunnel.Agent) (*agent, error) {
	log := cfg.Log
	a := &agent{log: log, w: w, eng: eng, endpoint: endpoint}
	so := cfg.Syncer
	if cfg.StateDir != "" {
		var err error
		if so.Recorded, err = eng.Factory.RecordedModels(); err != nil {
			log.Error(err, "Reading the records of runners an earlier agent left; they will be stopped, not adopted")
		} else if len(so.Recorded) > 0 {
			log.Info("Runners of an earlier agent to adopt", "models", so.Recorded)
		}
	}
	so.NodeName, so.Endpoint, so.Cache, so.Informer, so.Live, so.Client = cfg.NodeName, endpoint, w.cache, w.informer, w.direct, w.direct
	so.Pool, so.Store, so.Log = eng.Pool, cfg.Store, log.WithName("sync")
	if keeper != nil {
		so.Serving = keeper.Ready()
	}
	// The runner of a split replica whose head is this Mac reaches its workers' Macs.
	so.SplitLinks = newSplitLinks(w.direct, tlsSrc, out, log.WithName("splitlink"))
	// A worker shard here followed by another pushes its output to that one's Mac.
	a.peers = newPeerLinks(w.direct, tlsSrc, out, log.WithName("splitlink-peer"))
	var err error
	if a.syncer, err = NewSyncer(so); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	sopts := server.Options{Accelerators: devicegauge.Cached(devicegauge.Detect(), 10*time.Second), ClientCertificates: true, ResolveModel: a.syncer.Resolve,
		ListModels: a.syncer.ListModels, DeploymentOf: a.syncer.DeploymentOf, InlineImages: server.PolicyImages(cfg.SourcePolicy, ""), Log: log.WithName("http"), Registerer: reg, TracerProvider: cfg.TracerProvider,
		// Peer fetch: this Mac serves prompt states to the Macs a gateway's ticket
		// names, and fetches from other Macs with its own certificate.
		Peers: &server.PeerOptions{Node: cfg.NodeName, Roots: tlsSrc.Roots, Transport: peerTransports(tlsSrc, out)},
		// The link of a split replica's head to this Mac's worker shard of it.
		SplitLink: w.shards.handler(log.WithName("splitlink"))}
	if !cfg.NoServiceAccountTokens {
		issuer := satoken.Issuer(context.Background(), cfg.TokenIssuer, cs.Discovery().RESTClient(), log)
		rev, err := satoken.New(cs.AuthenticationV1().TokenReviews(), satoken.Options{Audience: cfg.TokenAudience, Issuer: issuer,
			TTL: cfg.TokenCacheTTL, Registerer: reg, Component: "agent"})
		if err != nil {
			return nil, err
		}
		sopts.ReviewToken = rev.Review
	}
	if a.srv, err = server.New(eng.Pool, sopts); err != nil {
		return nil, err
	}
	var pruner janitor.StorePruner
	if p, ok := cfg.Store.(janitor.StorePruner); ok {
		pruner = p
	}
	if a.jan = janitor.New(cfg.Janitor, pruner, eng.Factory, a.syncer.inUse, log.WithName("janitor")); a.jan != nil {
		for _, c := range a.jan.Collectors() {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return a, nil
}

// run runs the agent's loops until ctx ends or one fails: the replica cache, the
// sync, the certificate keeper, readiness, the stop of unclaimed runners, the
// janitor, cfg's Runnables, and a watch on the HTTP server.
func (a *agent) run(ctx context.Context, cfg Config, keeper *certs.Keeper, serveDone chan error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := a.w.cache.Start(gctx); err != nil && gctx.Err() == nil {
			return fmt.Errorf("the replica cache stopped: %w", err)
		}
		return nil
	})
	g.Go(func() error { return a.w.shards.start(gctx) })
	shardRuns := &shardSync{node: cfg.NodeName, shards: a.w.shards, peers: a.peers, pool: a.eng.Pool, store: cfg.Store, status: a.w.direct,
		log: a.log.WithName("shards"), started: map[string]*shardRun{}}
	g.Go(func() error { return shardRuns.run(gctx) })
	g.Go(func() error {
		if !toolscache.WaitForCacheSync(gctx.Done(), a.w.policySynced) {
			return nil
		}
		return a.syncer.Run(gctx)
	})
	if keeper != nil {
		g.Go(func() error { return keeper.Run(gctx) })
	}
	g.Go(func() error { return a.ready(gctx, keeper) })
	if cfg.StateDir != "" {
		g.Go(func() error { return a.stopUnclaimed(gctx) })
	}
	if a.jan != nil {
		g.Go(func() error { return a.jan.Run(gctx, a.w.cache.WaitForCacheSync) })
	}
	env := Env{NodeName: cfg.NodeName, Endpoint: a.endpoint, Pool: a.eng.Pool, Client: a.w.direct, Ready: a.w.informer.HasSynced}
	for _, r := range cfg.Runnables {
		g.Go(func() error { return r(gctx, env) })
	}
	g.Go(func() error {
		select {
		case <-gctx.Done():
			return nil
		case err := <-serveDone:
			serveDone <- err
			return fmt.Errorf("the HTTP server stopped: %w", err)
		}
	})
	return g.Wait()
}

// ready marks the server ready once the replicas are cached and the serving
// certificate (if the agent asks for its own) is there.
func (a *agent) ready(ctx context.Context, keeper *certs.Keeper) error {
	if !a.w.cache.WaitForCacheSync(ctx) {
		return nil
	}
	if keeper != nil {
		select {
		case <-keeper.Ready():
		case <-ctx.Done():
			return nil
		}
	}
	a.srv.SetReady(true)
	a.log.Info("Ready")
	return nil
}

// stopUnclaimed stops the runners an earlier agent left that no replica claimed in
// the first sync (deleted, changed, or OnDemand).
func (a *agent) stopUnclaimed(ctx context.Context) error {
	select {
	case <-a.syncer.InitialSync():
	case <-ctx.Done():
		return nil
	}
	n, err := a.eng.Factory.StopUnclaimed(ctx)
	if err != nil && ctx.Err() == nil {
		a.log.Error(err, "Stopping the runners no replica claimed")
	} else if n > 0 {
		a.log.Info("Stopped the runners of an earlier agent that no replica claimed", "runners", n)
	}
	return nil
}

// DefaultAdvertiseAddress is the first non-loopback IPv4 address of this host with
// the port of listenAddr. The API server refuses loopback addresses in
// EndpointSlices, so even a fleet on one machine advertises its real address.
func DefaultAdvertiseAddress(listenAddr string) (string, error) {
	_, port, err := net.SplitHostPort(listenAddr)
	if err != nil {
		return "", fmt.Errorf("the listen address %q: %w", listenAddr, err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("listing this host's addresses: %w", err)
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ip4 := ipn.IP.To4(); ip4 != nil && !ip4.IsLoopback() && !ip4.IsLinkLocalUnicast() {
			return net.JoinHostPort(ip4.String(), port), nil
		}
	}
	return "", errors.New("this host has no non-loopback IPv4 address to advertise: set --advertise-address")
}

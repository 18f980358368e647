// Package cluster runs the node agent in cluster mode (`macfleet agent`): it watches
// the ModelReplicas bound to its MacNode, drives its engine pool through an explicit
// transition table (table.go), downloads models through the store, reports each
// replica's status, and serves the OpenAI + admin API to the gateway and the
// per-deployment Services over TLS with a certificate of its own (agent/certs): the
// gateways and the manager present theirs, tenants a ServiceAccount token. The API
// server is never on the request path: the agent keeps serving while it is
// unreachable and resyncs when it returns.
package cluster

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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/certs"
	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/internal/informers"
	"github.com/macfleet/macfleet/metal"
	"github.com/macfleet/macfleet/pki"
	"github.com/macfleet/macfleet/runner/sandbox"
	"github.com/macfleet/macfleet/sourcepolicy"
	"github.com/macfleet/macfleet/tenancy/satoken"
	"github.com/macfleet/macfleet/tracing/spanrelay"
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
	Pool     *metal.Pool
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
	TokenAudience          string
	NoServiceAccountTokens bool
	TokenCacheTTL          time.Duration
	Store                  Store
	// SourcePolicy, when set, is kept at the cluster's SourcePolicy "default" (the
	// built-in default while there is none), and replicas are fetched only once it is
	// known. Give the store the same holder so that its downloads follow the policy.
	SourcePolicy *sourcepolicy.Holder
	// RunnerPath: see metal.ProcessConfig.RunnerPath. RunnerThreads are the threads of
	// runners whose replica sets none (zero: the thread policy, engine.PolicyThreads).
	// RunnerOutput, when set, receives every runner's output lines.
	RunnerPath    string
	RunnerThreads int
	RunnerOutput  io.Writer
	// RunnerSandbox: see metal.ProcessConfig.Sandbox (empty: on).
	RunnerSandbox sandbox.Mode
	// SocketDir holds the runners' sockets (metal.ProcessConfig.SocketDir).
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
	// PromptCacheSSDBytes is each replica's SSD quota and the most its deployment may
	// ask for (0: no SSD tier). The hot budget is Pool.PromptCacheHotBytes.
	PromptCacheDir      string
	PromptCacheSSDBytes int64
	// Pool tunes the engine pool (ceiling, reserve, timeouts, prompt cache hot budget).
	Pool metal.Config
	// TracerProvider traces the OpenAI requests (tracing.New); nil means none.
	TracerProvider trace.TracerProvider
	// SpanRelay exports the runners' spans, which they hand to the agent
	// (metal.ProcessConfig.SpanRelay; tracing.Provider.RunnerRelay); nil: runners make
	// none.
	SpanRelay *spanrelay.Forwarder
	// Gauge measures memory; nil means metal.NewGauge().
	Gauge metal.Gauge
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
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	direct, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating the API client: %w", err)
	}
	// The replica informer catches up within a second of an API server outage's end.
	rcache, err := cache.New(rc, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{
		&v1alpha1.ModelReplica{}: {Field: fields.OneTermEqualSelector(v1alpha1.ReplicaNodeNameField, cfg.NodeName)},
	}, NewInformer: informers.NewInformer(informers.Options{Log: log.WithName("informers")})})
	if err != nil {
		return fmt.Errorf("creating the replica cache: %w", err)
	}
	inf, err := rcache.GetInformer(ctx, &v1alpha1.ModelReplica{}, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("watching replicas: %w", err)
	}
	sii, ok := inf.(toolscache.SharedIndexInformer)
	if !ok {
		return fmt.Errorf("the replica informer is a %T, not a shared index informer", inf)
	}
	policySynced := func() bool { return true }
	if cfg.SourcePolicy != nil {
		if policySynced, err = watchSourcePolicy(ctx, rcache, cfg.SourcePolicy, log.WithName("sourcepolicy")); err != nil {
			return err
		}
	}

	gauge := cfg.Gauge
	if gauge == nil {
		if gauge, err = metal.NewGauge(); err != nil {
			return fmt.Errorf("measuring memory: %w", err)
		}
	}
	runnerPath, err := metal.RunnerExecutable(cfg.RunnerPath)
	if err != nil {
		return err
	}
	pcfg := metal.ProcessConfig{RunnerPath: runnerPath, Threads: cfg.RunnerThreads, PerformanceCores: hardware.PerformanceCores(),
		SocketDir: cfg.SocketDir, Sandbox: cfg.RunnerSandbox,
		Log: log.WithName("runner"), Output: cfg.RunnerOutput,
		PromptCacheDir: cfg.PromptCacheDir, PromptCacheSSDBytes: cfg.PromptCacheSSDBytes, SpanRelay: cfg.SpanRelay}
	poolCfg := cfg.Pool
	if cfg.StateDir != "" {
		pcfg.StateDir = filepath.Join(cfg.StateDir, "runners")
		poolCfg.KeepRunnersOnExit = cfg.KeepRunners
	}
	factory := metal.NewProcessFactory(pcfg)
	pool, err := metal.New(poolCfg, factory, gauge, clock.RealClock{}, log.WithName("pool"))
	if err != nil {
		return err
	}

	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating the API clientset: %w", err)
	}
	tlsSrc, keeper := cfg.Certificates, (*certs.Keeper)(nil)
	if tlsSrc == nil {
		tlsSrc = &pki.Source{}
		keyFile := "" // without a state directory the key lives as long as the agent
		if cfg.StateDir != "" {
			keyFile = KeyFile(cfg.StateDir)
		}
		keeper = certs.New(certs.Options{Clientset: cs, NodeName: cfg.NodeName, Source: tlsSrc, KeyFile: keyFile,
			Lifetime: cfg.CertificateLifetime, Log: log.WithName("certs")})
	}
	ln := cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
			return fmt.Errorf("listening on %s: %w", cfg.Listen, err)
		}
	}
	// The connection cap wraps the TCP listener, beneath TLS; TLS only: a caller that
	// speaks plain HTTP gets no answer.
	ln = tls.NewListener(httpserver.Listener(ln, httpserver.Limits{}), tlsSrc.ServerConfig())
	endpoint := cfg.AdvertiseAddress
	if endpoint == "" {
		if endpoint, err = DefaultAdvertiseAddress(ln.Addr().String()); err != nil {
			ln.Close()
			return err
		}
	} else if host, port, err := net.SplitHostPort(endpoint); err == nil && port == "0" {
		_, lport, _ := net.SplitHostPort(ln.Addr().String())
		endpoint = net.JoinHostPort(host, lport)
	}

	so := cfg.Syncer
	if cfg.StateDir != "" {
		if so.Recorded, err = factory.RecordedModels(); err != nil {
			log.Error(err, "Reading the records of runners an earlier agent left; they will be stopped, not adopted")
		} else if len(so.Recorded) > 0 {
			log.Info("Runners of an earlier agent to adopt", "models", so.Recorded)
		}
	}
	so.NodeName, so.Endpoint, so.Cache, so.Informer, so.Live, so.Client = cfg.NodeName, endpoint, rcache, sii, direct, direct
	so.Pool, so.Store, so.Log = pool, cfg.Store, log.WithName("sync")
	syncer, err := NewSyncer(so)
	if err != nil {
		ln.Close()
		return err
	}
	reg := prometheus.NewRegistry()
	sopts := server.Options{ClientCertificates: true, ResolveModel: syncer.Resolve,
		ListModels: syncer.ListModels, DeploymentOf: syncer.DeploymentOf, Log: log.WithName("http"), Registerer: reg, TracerProvider: cfg.TracerProvider}
	if !cfg.NoServiceAccountTokens {
		rev, err := satoken.New(cs.AuthenticationV1().TokenReviews(),
			satoken.Options{Audience: cfg.TokenAudience, TTL: cfg.TokenCacheTTL, Registerer: reg, Component: "agent"})
		if err != nil {
			ln.Close()
			return err
		}
		sopts.ReviewToken = rev.Review
	}
	srv, err := server.New(pool, sopts)
	if err != nil {
		ln.Close()
		return err
	}
	var pruner janitor.StorePruner
	if p, ok := cfg.Store.(janitor.StorePruner); ok {
		pruner = p
	}
	jan := janitor.New(cfg.Janitor, pruner, factory, syncer.inUse, log.WithName("janitor"))
	if jan != nil {
		for _, c := range jan.Collectors() {
			if err := reg.Register(c); err != nil {
				ln.Close()
				return err
			}
		}
	}
	httpSrv := httpserver.New(srv.Handler(), httpserver.Limits{})

	// The pool outlives ctx: it unloads everything on shutdown, after the HTTP
	// server stopped taking requests.
	poolCtx, stopPool := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPool()
	poolDone := make(chan error, 1)
	go func() { poolDone <- pool.Run(poolCtx) }()
	serveDone := make(chan error, 1)
	go func() { serveDone <- httpSrv.Serve(ln) }()
	log.Info("Serving the OpenAI and admin API", "addr", ln.Addr().String(), "endpoint", endpoint, "node", cfg.NodeName,
		"runner", runnerPath, "ceiling", pool.Ceiling().Describe())
	if cfg.Started != nil {
		cfg.Started(ln.Addr().String(), endpoint)
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := rcache.Start(gctx); err != nil && gctx.Err() == nil {
			return fmt.Errorf("the replica cache stopped: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if !toolscache.WaitForCacheSync(gctx.Done(), policySynced) {
			return nil
		}
		return syncer.Run(gctx)
	})
	if keeper != nil {
		g.Go(func() error { return keeper.Run(gctx) })
	}
	g.Go(func() error {
		if !rcache.WaitForCacheSync(gctx) {
			return nil
		}
		if keeper != nil {
			select {
			case <-keeper.Ready():
			case <-gctx.Done():
				return nil
			}
		}
		srv.SetReady(true)
		log.Info("Ready")
		return nil
	})
	if cfg.StateDir != "" {
		// Runners an earlier agent left that no replica claimed in the first sync
		// (deleted, changed, or OnDemand) are stopped.
		g.Go(func() error {
			select {
			case <-syncer.InitialSync():
			case <-gctx.Done():
				return nil
			}
			n, err := factory.StopUnclaimed(gctx)
			if err != nil && gctx.Err() == nil {
				log.Error(err, "Stopping the runners no replica claimed")
			} else if n > 0 {
				log.Info("Stopped the runners of an earlier agent that no replica claimed", "runners", n)
			}
			return nil
		})
	}
	if jan != nil {
		g.Go(func() error { return jan.Run(gctx, rcache.WaitForCacheSync) })
	}
	env := Env{NodeName: cfg.NodeName, Endpoint: endpoint, Pool: pool, Client: direct, Ready: sii.HasSynced}
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
	runErr := g.Wait()
	if errors.Is(runErr, context.Canceled) {
		runErr = nil
	}

	timeout := cfg.ShutdownTimeout
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	log.Info("Shutting down: draining requests and unloading models", "timeout", timeout)
	err = errors.Join(runErr, srv.Shutdown(httpSrv, stopPool, poolDone, timeout))
	if err == nil {
		log.Info("Stopped")
	}
	return err
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

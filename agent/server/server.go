// Package server is the node agent's HTTP API: the OpenAI endpoints clients and the
// gateway call (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models),
// proxied to the model's runner process under a lease of the engine pool, and the
// admin endpoints (/api/status, model load and unload, cache clear, /metrics,
// /healthz, /readyz).
//
// Every generation request goes: validate the body (400) → acquire a lease (routing;
// 404, 503 + Retry-After, 507) → prefill guard (tokenize through the runner, then the
// pool's check; 413 before any byte is written) → proxy to the runner with the
// request's context (a client that goes away cancels the generation) → release the
// lease once the last byte is written. Status codes follow the contract of
// ENGINE_POOL.md.
package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/chat/translate"
	"github.com/macfleet/macfleet/internal/devicegauge"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// Defaults of Options.
const (
	DefaultMaxBodyBytes = 16 << 20
	// DefaultExitWait bounds how long a request whose runner connection broke waits
	// to learn whether the runner died, to tell the client which.
	DefaultExitWait = 2 * time.Second
)

// Options configure a Server.
type Options struct {
	// Accelerators reads the node's cards with memory of their own for /api/status
	// (devicegauge.Detect); nil on a Mac.
	Accelerators devicegauge.Gauge
	// APIKey, when set, is required as "Authorization: Bearer KEY" everywhere but
	// /healthz and /readyz.
	APIKey string
	// APIKeyFunc, when set, is called per request for the key instead of APIKey, so
	// that a rotated key takes effect at once. It must be cheap and never return "".
	APIKeyFunc func() string
	// ClientCertificates authenticates callers by the client certificate they
	// presented on a TLS listener that checked it against the fleet CA
	// (pki.Source.ServerConfig), by authorizeCertificate: a gateway or the manager is
	// an admin (the whole API, and a gateway's queue reports count); a metrics
	// scraper's certificate reaches /metrics only; a Mac's certificate is refused, so
	// one compromised Mac reaches no other, but for the prompt states a gateway's
	// ticket grants it (Peers). Callers without a certificate need the API key
	// or (OpenAI API only) a ServiceAccount token.
	ClientCertificates bool
	// ReviewToken, when set, authenticates on the OpenAI API (/v1/...) a bearer
	// credential that is not the API key and is shaped like a ServiceAccount token
	// (satoken.LooksLikeToken): a tenant identity that ResolveModel and ListModels
	// scope. A *satoken.RefusedError is a 401; another error a 503 to retry. The
	// admin API (/api/..., /metrics) takes only the API key.
	ReviewToken func(ctx context.Context, token string) (tenancy.Identity, error)
	// MaxBodyBytes bounds request bodies (413 above it); zero means 16 MiB.
	MaxBodyBytes int64
	// Registerer receives the agent's metrics and Gatherer serves /metrics; nil means
	// a new registry for both (a Registerer that is also a Gatherer serves itself).
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// ExitWait: see DefaultExitWait.
	ExitWait time.Duration
	// ResolveModel, when set, names the pool entry that serves a generation request,
	// from the request (its headers and its caller's tenancy.IdentityFrom) and the
	// model named in its body; without it the
	// body's model is the entry's name or alias (standalone). Errors implementing
	// enginepool.StatusError keep their status and code (for example 400 for a name that
	// is ambiguous, 404 for an unknown one).
	ResolveModel func(r *http.Request, model string) (string, error)
	// InlineImages, when set, puts a chat request's http(s) images inline before a
	// runner sees it (PolicyImages); without it they reach the runner, which refuses them.
	InlineImages InlineImagesFunc
	// DeploymentOf, when set, names the deployment ("namespace/name") of a pool
	// entry: the deployment label of the usage counters of callers that are not
	// admins (macfleet_usage_requests_total, macfleet_usage_tokens_total, as the
	// gateway's). Without it the entry's name is the label.
	DeploymentOf func(entry string) string
	// ListModels, when set, gives the ids GET /v1/models lists to r's caller instead
	// of the pool's entries.
	ListModels func(r *http.Request) []string
	// Peers, when set, takes part in peer fetch (api/runnerapi/peerstate.go): it
	// serves prompt states to other Macs that present a gateway's ticket, and follows
	// a gateway's hint to fetch one before a request (peerstate.go). Nil: a Mac's
	// certificate reaches nothing and hints are dropped.
	Peers *PeerOptions
	// SplitLink, when set, serves GET /api/split/{namespace}/{replica}: the link the
	// Mac of a split replica's head opens to this Mac's worker shard of it, and
	// .../peer, the one the Mac of the worker shard before it opens (package
	// agent/splitlink, which checks the caller's node certificate against the replica).
	// Nil: the endpoint does not exist.
	SplitLink http.Handler
	// TracerProvider, when set, traces every OpenAI request (see trace.go); nil means
	// no tracing.
	TracerProvider trace.TracerProvider
	Log            logr.Logger
}

// Server serves the agent's API over one engine pool.
type Server struct {
	pool    *enginepool.Pool
	opts    Options
	log     logr.Logger
	metrics *metrics
	peers   *peerMetrics
	tracer  trace.Tracer // nil: tracing off
	// spans starts the request's child spans: tracer, or a no-op one when it is off.
	spans   trace.Tracer
	started time.Time
	ready   atomic.Bool
	handler http.Handler
	// queues are the gateways' reports of their queues (GatewayQueues in /api/status).
	queues gatewayQueues
	// requests are the runners of the requests in progress a gateway named, for
	// /api/requests/cancel.
	requests requestRunners
}

// New builds the server over pool and registers its metrics — the request metrics and
// the pool's own (enginepool.NewMetrics) — on opts.Registerer. The server is not ready
// (/readyz answers 503) until SetReady(true).
func New(pool *enginepool.Pool, opts Options) (*Server, error) {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.ExitWait <= 0 {
		opts.ExitWait = DefaultExitWait
	}
	if opts.Registerer == nil {
		reg := prometheus.NewRegistry()
		opts.Registerer, opts.Gatherer = reg, reg
	}
	if opts.Gatherer == nil {
		g, ok := opts.Registerer.(prometheus.Gatherer)
		if !ok {
			return nil, errors.New("server: a Registerer that is not a Gatherer needs Options.Gatherer for /metrics")
		}
		opts.Gatherer = g
	}
	m, err := newMetrics(opts.Registerer, pool)
	if err != nil {
		return nil, err
	}
	s := &Server{pool: pool, opts: opts, log: opts.Log, metrics: m, peers: newPeerMetrics(), started: time.Now()}
	for _, c := range s.peers.collectors() {
		if err := opts.Registerer.Register(c); err != nil {
			return nil, err
		}
	}
	s.spans = noop.NewTracerProvider().Tracer(tracerName)
	if opts.TracerProvider != nil {
		s.tracer = opts.TracerProvider.Tracer(tracerName)
		s.spans = s.tracer
	}
	s.handler = s.recoverer(s.authenticate(s.routes()))
	return s, nil
}

// Handler is the whole API.
func (s *Server) Handler() http.Handler { return s.handler }

// SetReady switches /readyz.
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// Shutdown takes the agent out of service within timeout: /readyz fails, httpSrv
// stops accepting connections and drains the requests in flight while the pool
// unloads every model (stopPool ends the pool's Run, whose result poolDone
// delivers; its drain lets leases finish, then aborts what remains).
func (s *Server) Shutdown(httpSrv *http.Server, stopPool func(), poolDone <-chan error, timeout time.Duration) error {
	s.SetReady(false)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	httpDone := make(chan error, 1)
	go func() { httpDone <- httpSrv.Shutdown(ctx) }()
	stopPool()
	var errs []error
	select {
	case err := <-poolDone:
		if err != nil {
			errs = append(errs, fmt.Errorf("unloading models: %w", err))
		}
	case <-ctx.Done():
		errs = append(errs, errors.New("unloading models: shutdown timed out"))
	}
	if err := <-httpDone; err != nil {
		_ = httpSrv.Close()
		errs = append(errs, fmt.Errorf("draining requests: %w", err))
	}
	return errors.Join(errs...)
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	openai := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, s.instrument(h)) }
	openai("POST /v1/chat/completions", s.handleChat)
	// The Responses and Anthropic Messages APIs, translated to and from chat.
	mux.Handle("POST /v1/responses", s.instrument(translate.Responses(http.HandlerFunc(s.handleChat)).ServeHTTP))
	mux.Handle("POST /v1/messages", s.instrument(translate.Anthropic(http.HandlerFunc(s.handleChat)).ServeHTTP))
	mux.Handle("POST /v1/messages/count_tokens", s.instrument(translate.AnthropicCountTokens(http.HandlerFunc(s.handleChatTokens)).ServeHTTP))
	openai("POST /v1/completions", s.handleCompletion)
	openai("POST /v1/embeddings", s.handleEmbeddings)
	mux.HandleFunc("GET /v1/models", s.handleListModels)
	mux.HandleFunc("GET /v1/models/{id...}", s.handleGetModel)

	mux.HandleFunc("GET /api/status", s.handleStatus)
	mux.HandleFunc("POST /api/models/{id}/load", s.handleLoad)
	mux.HandleFunc("POST /api/models/{id}/unload", s.handleUnload)
	mux.HandleFunc("GET /api/models/{id}/prefixes", s.handlePrefixes)
	mux.HandleFunc("GET /api/models/{id}/states/{digest}", s.handleState)
	mux.HandleFunc("POST /api/models/{id}/states/warm", s.handleWarm)
	mux.HandleFunc("POST /api/cache/clear", s.handleCacheClear)
	mux.HandleFunc("POST /api/requests/cancel", s.handleCancel)
	if s.opts.SplitLink != nil {
		mux.Handle("GET /api/split/{namespace}/{replica}", s.opts.SplitLink)
		mux.Handle("GET /api/split/{namespace}/{replica}/peer", s.opts.SplitLink)
	}
	mux.Handle("GET /metrics", s.metricsHandler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.HandleFunc("/", s.handleUnknownRoute)
	return mux
}

// knownPaths answer 405 rather than 404 to a wrong method.
var knownPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
	"/api/status", "/api/cache/clear", "/api/requests/cancel", "/metrics", "/healthz", "/readyz"}

func (s *Server) handleUnknownRoute(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	known := strings.HasPrefix(p, "/v1/models/") ||
		(strings.HasPrefix(p, "/api/models/") && (strings.HasSuffix(p, "/load") || strings.HasSuffix(p, "/unload") || strings.HasSuffix(p, "/prefixes"))) ||
		isStatePath(r.URL.EscapedPath())
	for _, k := range knownPaths {
		known = known || p == k
	}
	if known {
		writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: openaierr.TypeInvalidRequest, Code: openaierr.CodeMethodNotAllowed,
			Message: r.Method + " is not allowed on " + p})
		return
	}
	writeError(w, &apiError{Status: http.StatusNotFound, Type: openaierr.TypeInvalidRequest, Code: openaierr.CodeNotFound,
		Message: "no such endpoint: " + r.Method + " " + p})
}

// authenticate requires, on everything but the health probes, a client certificate
// of a gateway or the manager (Options.ClientCertificates; a metrics scraper's on
// /metrics only, see authorizeCertificate), the API key if one is
// configured, or on the OpenAI API a ServiceAccount token (Options.ReviewToken). The
// caller's identity goes into the request's context: an admin for a caller's
// certificate or the API key (or when nothing is configured), the ServiceAccount's
// namespace for a token.
func (s *Server) authenticate(next http.Handler) http.Handler {
	admin := func(w http.ResponseWriter, r *http.Request, c caller) {
		ctx := tenancy.WithIdentity(context.WithValue(r.Context(), callerKey{}, c), tenancy.Identity{Admin: true})
		next.ServeHTTP(w, r.WithContext(ctx))
	}
	key := s.opts.APIKeyFunc
	if key == nil {
		if s.opts.APIKey == "" && !s.opts.ClientCertificates {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { admin(w, r, caller{reportsQueues: true}) })
		}
		static := s.opts.APIKey
		key = func() string { return static }
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			next.ServeHTTP(w, r)
			return
		}
		if s.opts.ClientCertificates {
			if id, ok := pki.PeerIdentity(r.TLS); ok {
				access := authorizeCertificate(id, certRequest{method: r.Method, path: r.URL.EscapedPath(),
					ticket: r.Header.Get(runnerapi.HeaderPeerTicket)}, s.ticketCheck())
				if access.refused != "" {
					writeError(w, &apiError{Status: http.StatusForbidden, Type: typePermission, Code: codeForbiddenCaller, Message: access.refused})
					return
				}
				admin(w, r, caller{reportsQueues: access.reportsQueues, gateway: access.gateway, ticket: access.ticket})
				return
			}
		}
		got := r.Header.Get("Authorization")
		if x := r.Header.Get("X-Api-Key"); got == "" && x != "" {
			got = "Bearer " + x // Anthropic clients send the key as x-api-key
		}
		k := key()
		if k != "" && subtle.ConstantTimeCompare([]byte(got), []byte("Bearer "+k)) == 1 {
			admin(w, r, caller{reportsQueues: true})
			return
		}
		token, _ := strings.CutPrefix(got, "Bearer ")
		tokenShaped := s.opts.ReviewToken != nil && satoken.LooksLikeToken(token)
		how, missing, adminOnly := "send it as Authorization: Bearer KEY (or x-api-key: KEY)", "missing API key: ", "the API key"
		if s.opts.ClientCertificates {
			how = "the gateways and the manager present their fleet certificate; tenants send a ServiceAccount token as Authorization: Bearer TOKEN"
			missing, adminOnly = "missing credentials: ", "a gateway's or the manager's certificate"
		}
		msg := "invalid API key: " + how
		switch {
		case got == "":
			msg = missing + how
		case tokenShaped && !strings.HasPrefix(r.URL.Path, "/v1/"):
			// Tenants never reach the admin API (unload, cache clear, status, metrics).
			msg = "the node agent's admin API takes only " + adminOnly + "; a ServiceAccount token reaches only the OpenAI API under /v1/"
		case tokenShaped:
			id, err := s.opts.ReviewToken(satoken.WithSource(r.Context(), httpserver.SourceOf(r.RemoteAddr)), token)
			var refused *satoken.RefusedError
			var limited *satoken.LimitedError
			switch {
			case err == nil:
				next.ServeHTTP(w, r.WithContext(tenancy.WithIdentity(r.Context(), id)))
				return
			case errors.As(err, &limited):
				writeError(w, &apiError{Status: http.StatusTooManyRequests, Type: openaierr.TypeRateLimit, Code: openaierr.CodeTokenReviewLimited,
					Message: limited.Error(), RetryAfter: limited.RetryAfter})
				return
			case !errors.As(err, &refused):
				s.log.Error(err, "Reviewing a ServiceAccount token")
				writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: openaierr.TypeUnavailable, Code: openaierr.CodeTokenReview,
					Message: "the ServiceAccount token could not be checked now (the TokenReview failed; it was logged by the node agent); retry", RetryAfter: time.Second})
				return
			}
			msg = "invalid ServiceAccount token: " + refused.Reason + "; send a current token of an existing ServiceAccount, projected with this fleet's audience"
		}
		writeError(w, &apiError{Status: http.StatusUnauthorized, Type: openaierr.TypeAuthentication, Code: openaierr.CodeInvalidAPIKey,
			Message: msg})
	})
}

// caller is what a request's admin may do beyond the API (the context holds it under
// callerKey{}): reportsQueues — its X-Macfleet-Queued reports count (a gateway's
// certificate; the API key, or no authentication, where no certificates are used);
// gateway — a gateway's certificate, whose peer fetch hints are followed; ticket — a
// Mac's checked state ticket (its only access: GET /api/models/{id}/states/{digest}).
type caller struct {
	reportsQueues bool
	gateway       bool
	ticket        *pki.StateTicket
}

func callerOf(r *http.Request) caller {
	c, _ := r.Context().Value(callerKey{}).(caller)
	return c
}

type callerKey struct{}

// recoverer turns a handler panic into a logged 500 (when nothing was sent yet) so one
// bad request never takes the agent down. It is a last resort: handlers validate.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return openaierr.Recover(next, s.log, "internal error; it was logged by the node agent")
}

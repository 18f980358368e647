// Package gateway is the fleet-wide OpenAI endpoint (`macfleet gateway`). It keeps a
// routing table of every ModelDeployment's routable replicas, fed by informers on
// ModelDeployments, ModelReplicas and MacNodes, and proxies each OpenAI request to the
// agent of one replica:
//
//   - Routing: the body's "model" is a deployment's served name or alias;
//     "<namespace>/<name>" always works; a bare name served in several namespaces is a
//     400 asking the client to qualify it; an unknown one is a 404 model_not_found
//     (every one is a retryable 503 gateway_starting until the first table is built).
//   - Balancing: least outstanding requests (the gateway's own in-flight count per
//     replica); with prefix affinity, consistent hashing with bounded loads on a ring
//     of replica keys, keyed by the prompt's first bytes, so every gateway replica
//     sends the same prefix to the same replica while its load allows.
//   - Proxying: method, path and body unchanged to http://<endpoint><path> with the
//     fleet token and X-Macfleet-Replica; responses stream through unbuffered; a
//     connect error, 503 or 507 before the first byte is retried on another replica;
//     other statuses pass through. With no routable replica of an existing deployment,
//     the request is held until one appears (a cold start), up to ColdStartTimeout,
//     then answered 503 with Retry-After. An autoscaled deployment is woken first,
//     even from zero replicas: the gateway writes its wake annotation (see package wake).
//   - GET /v1/models lists one entry per deployment (see handleListModels).
//   - Optional API keys: admin keys from a file (one per line, re-read when it
//     changes) and teams' keys from Secrets (TenantKeys, package tenancy; the
//     gateway reads the manager's index of them, controllers/apikeyindex), each
//     reaching only what its namespace may use (Table.ResolveAs),
//     Prometheus metrics, and the client's disconnect cancels the upstream request.
//
// Only POST /v1/... is forwarded: the agents' admin API (/api/...) is never reachable
// through the gateway, which holds the fleet token.
package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/cachestats"
	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/gateway/keepalive"
	"github.com/macfleet/macfleet/gateway/prefixindex"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/gateway/usagemeter"
	"github.com/macfleet/macfleet/gateway/wake"
	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/tunnel"
)

// HeaderPriority is the request header that asks for a priority class: interactive
// (the default) or batch. A key's own class (see KeysFile) caps it.
const HeaderPriority = admission.HeaderPriority

// Defaults of Options.
const (
	// DefaultMaxInFlightPerSlot is how many requests the gateway sends to a replica at
	// once per sequence slot of its engine (admission.DefaultMaxInFlightPerSlot).
	DefaultMaxInFlightPerSlot = admission.DefaultMaxInFlightPerSlot

	DefaultColdStartTimeout = 2 * time.Minute
	// DefaultStreamKeepAlive is Options.StreamKeepAlive's default (keepalive.DefaultInterval).
	DefaultStreamKeepAlive = keepalive.DefaultInterval
	DefaultMaxBodyBytes    = 16 << 20
	// DefaultConnectTimeout bounds dialing an agent; a Mac that does not answer is
	// skipped for another replica.
	DefaultConnectTimeout = 3 * time.Second
)

// WakeFunc records on a ModelDeployment that a gateway holds requests for it (package
// wake's Func).
type WakeFunc = wake.Func

// Options configure a Gateway.
type Options struct {
	// AgentCertificates, when set, is the client certificate and CA bundle the gateway
	// calls agents with: over HTTPS, through one connection pool per Mac, each
	// handshake requiring the certificate of the Mac the replica is bound to (not
	// whatever answers at its status.endpoint). Without it agents are called over
	// plain HTTP (tests' fake agents).
	AgentCertificates *pki.Source
	// PrefixDigestKey returns the key every gateway replica shares for prefix digests
	// (the manager's, from the Secret with AgentCertificates), ok false until it has
	// loaded: requests are then not routed by prefix. Nil digests unkeyed (tests, a
	// gateway without the Secret).
	PrefixDigestKey func() (key []byte, ok bool)
	// Tunnels, with AgentCertificates, are the connections of agents that dial out
	// (package tunnel): a request for a Mac that holds one goes through it instead of
	// to the replica's endpoint.
	Tunnels *tunnel.Sessions
	// FleetToken returns a token sent to agents as "Authorization: Bearer <token>";
	// nil or "" sends none. Agents in cluster mode take certificates instead; this
	// reaches agents that take a key (tests' fake agents).
	FleetToken func() string
	// ColdStartTimeout bounds how long a request waits for a routable replica, or in
	// the queue for a replica with room.
	ColdStartTimeout time.Duration
	// StreamContinuations is how many times one Chat Completions stream whose replica
	// failed after its first byte may be continued on another replica
	// (DefaultStreamContinuations when zero; negative: never, the stream ends with the
	// error). ContinueTimeout bounds the wait for a replica to take a continuation
	// (DefaultContinueTimeout when zero).
	StreamContinuations int
	ContinueTimeout     time.Duration
	// StreamKeepAlive is the longest a streaming request the gateway holds (queued, a
	// cold start, a prefill) stays silent: after it, a keep-alive event goes out, the
	// first one committing status 200 (package keepalive). keepalive.DefaultInterval
	// when zero; negative: none.
	StreamKeepAlive time.Duration
	// CancelGrace bounds how long an answer whose client went away is read on for its
	// usage after the agent was asked to end it (DefaultCancelGrace when zero).
	CancelGrace time.Duration
	// MaxInFlightPerSlot is how many requests the gateway sends to a replica at once
	// per sequence slot of its engine; more wait in the deployment's fair queue. 0
	// means DefaultMaxInFlightPerSlot; negative means no limit (every request goes to
	// a replica at once and waits in its runner's queue: no fairness).
	MaxInFlightPerSlot int
	// Queue bounds each deployment's fair queue (fairqueue's defaults for zero fields).
	Queue fairqueue.Limits
	// Identify, when set, requires a client API key ("Authorization: Bearer <key>" or
	// "x-api-key: <key>") and says who it is and whether it is accepted (see
	// KeysFile.Identify). Its priority is the highest the key's requests get. A key
	// that is not an admin key reaches and lists only the deployments its namespace
	// may use (tenancy.MayUse); any other is answered as a model that does not exist.
	// nil means no client auth: every caller is an admin.
	Identify func(key string) (tenancy.Identity, bool)
	// ReviewToken, when set, authenticates a bearer credential shaped like a
	// ServiceAccount token (satoken.LooksLikeToken) that Identify does not know: the
	// identity of its ServiceAccount (package satoken), reaching what its namespace
	// may use. A *satoken.RefusedError is a 401; another error (the API server could
	// not be asked) a 503 to retry. It requires a credential as Identify does.
	ReviewToken func(ctx context.Context, token string) (tenancy.Identity, error)
	// Wake, when set, records that requests are held for an autoscaled deployment with
	// no routable replica, so the autoscaler brings one (scale from zero). Without it
	// a deployment at zero replicas is a 503 at once.
	Wake WakeFunc
	// Routing is how a replica is picked (see Routing). Empty means
	// RoutingPrefixAffinity with PrefixAffinity, else RoutingLeastLoad.
	Routing Routing
	// NoInFlightPrefixes keeps RoutingPrefixCache to what the index holds, without
	// the record of the prefixes being prefilled (prefixindex.InFlight), as before it:
	// for comparing the two in one benchmark run.
	NoInFlightPrefixes bool
	// PrefixAffinity routes by consistent hashing with bounded loads on the prompt's
	// first PrefixBytes bytes instead of pure least-outstanding (Routing empty).
	PrefixAffinity bool
	PrefixBytes    int
	// LoadBound is c of the bounded loads (DefaultLoadBound when < 1).
	LoadBound float64
	// MaxBodyBytes bounds request bodies (413 above it).
	MaxBodyBytes int64
	// Registerer receives the metrics; nil means a new registry.
	Registerer prometheus.Registerer
	// Transport reaches the agents; nil means one tuned for many streams to few hosts
	// (per Mac, with AgentCertificates).
	Transport http.RoundTripper
	// TracerProvider, when set, traces every proxied request (see trace.go); nil means
	// no tracing.
	TracerProvider trace.TracerProvider
	// DisablePeerFetch turns off peer fetch under RoutingPrefixCache (see
	// peerFetcher): a request routed to a replica that holds less of its prefix than
	// one on another Mac is then always prefilled. Peer fetch also needs
	// AgentCertificates (its tickets are signed with the gateway's key).
	DisablePeerFetch bool
	// PeerFetchMargin is how many times faster than the prefill a fetch must be
	// estimated (peerfetch.DefaultMargin when ≤ 0).
	PeerFetchMargin float64
	// Budgets, when set, checks team callers' requests against their TokenBudgets
	// before they are queued (429 over one) and counts their usage in its ledger.
	Budgets *admission.Budgets
	Log     logr.Logger
}

// Gateway is the HTTP handler of the fleet's OpenAI API.
type Gateway struct {
	// id names this gateway process to the agents (mfv1.HeaderGateway).
	id        string
	opts      Options
	log       logr.Logger
	table     atomic.Pointer[Table]
	bal       *routing.Balancer
	adm       *admission.Queues
	traffic   *traffic
	metrics   *metrics
	waker     *wake.Waker
	tracer    trace.Tracer // nil: tracing off
	transport http.RoundTripper
	// prefixes polls the agents' prefix events into the balancer's index under
	// RoutingPrefixCache; nil otherwise.
	prefixes *prefixindex.Poller
	// peers asks agents to fetch prefixes from peer Macs (RoutingPrefixCache); nil
	// when off.
	peers *peerFetcher
	// warm warms cold replicas from their peers (warmup.go); nil with peers.
	warm *warmer
	// cacheStats reads the replicas' prompt cache counters for the console.
	cacheStats *cachestats.Stats
	// meter counts the usage the replicas report for the answers.
	meter *usagemeter.Meter
	// agentScheme is "https://" with Options.AgentCertificates, else "http://".
	agentScheme string
	handler     http.Handler
}

// New builds a gateway with an empty table: every model is a 503 (the gateway is
// starting) until SetTable.
func New(opts Options) (*Gateway, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	var index *prefixindex.Index
	if opts.Routing == RoutingPrefixCache {
		if index, err = prefixindex.New(0, opts.Registerer); err != nil {
			return nil, err
		}
	}
	bal := routing.NewBalancer(opts.LoadBound, index, !opts.NoInFlightPrefixes)
	g := &Gateway{opts: opts, log: opts.Log, bal: bal, metrics: m, transport: opts.Transport,
		id: newGatewayID()}
	g.setAgentTransport()
	if err := g.newPrefixSharing(index); err != nil {
		return nil, err
	}
	if opts.TracerProvider != nil {
		g.tracer = opts.TracerProvider.Tracer(tracerName)
	}
	g.table.Store(routing.StartingTable())
	g.adm = admission.New(admission.Settings{PerSlot: opts.MaxInFlightPerSlot, Limits: opts.Queue, RetryAfter: coldRetryAfter},
		g.bal, g.Table, admission.Metrics{QueueDepth: m.queueDepth, QueueWait: m.queueWait, QueueRejected: m.queueRejected})
	g.traffic = newTraffic()
	g.meter = newMeter(opts, m)
	g.cacheStats = cachestats.New(cachestats.HTTPFetch{Transport: g.transport, Scheme: g.agentScheme, Prepare: g.toAgent})
	if opts.Wake != nil {
		g.waker = wake.New(wake.Config{Write: opts.Wake, Table: g.Table, Results: m.wakes, Log: opts.Log.WithName("wake")})
	}
	g.handler = g.recoverer(anthropicErrors(g.authenticate(g.routes())))
	return g, nil
}

// withDefaults is opts with the defaults in place of the settings left out, or an
// error when its routing is not one the gateway knows.
func (opts Options) withDefaults() (Options, error) {
	if opts.ColdStartTimeout <= 0 {
		opts.ColdStartTimeout = DefaultColdStartTimeout
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.StreamContinuations == 0 {
		opts.StreamContinuations = DefaultStreamContinuations
	}
	if opts.ContinueTimeout <= 0 {
		opts.ContinueTimeout = DefaultContinueTimeout
	}
	if opts.StreamKeepAlive == 0 {
		opts.StreamKeepAlive = DefaultStreamKeepAlive
	}
	if opts.CancelGrace <= 0 {
		opts.CancelGrace = DefaultCancelGrace
	}
	if opts.MaxInFlightPerSlot == 0 {
		opts.MaxInFlightPerSlot = DefaultMaxInFlightPerSlot
	}
	if opts.PrefixBytes <= 0 {
		opts.PrefixBytes = DefaultPrefixBytes
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.FleetToken == nil {
		opts.FleetToken = func() string { return "" }
	}
	if opts.Routing == "" {
		opts.Routing = RoutingLeastLoad
		if opts.PrefixAffinity {
			opts.Routing = RoutingPrefixAffinity
		}
	}
	if _, err := ParseRouting(string(opts.Routing)); err != nil {
		return opts, err
	}
	return opts, nil
}

// setAgentTransport sets the scheme and, unless Options gave one, the transport to
// the agents: TLS with Options.AgentCertificates, plain HTTP otherwise.
func (g *Gateway) setAgentTransport() {
	g.agentScheme = "http://"
	if g.opts.AgentCertificates != nil {
		g.agentScheme = "https://"
		if g.transport == nil {
			newBase := NewTransport
			if t := g.opts.Tunnels; t != nil {
				newBase = func() *http.Transport {
					tr := NewTransport()
					tr.DialContext = t.DialContext(pki.NodeFrom, tr.DialContext)
					return tr
				}
			}
			g.transport = pki.NewTransports(g.opts.AgentCertificates, newBase)
		}
	}
	if g.transport == nil {
		g.transport = NewTransport()
	}
}

// newPrefixSharing makes the parts that share prompt prefixes between replicas: the
// peer fetcher, the warmer and, with a prefix index, its poller (nil when off).
func (g *Gateway) newPrefixSharing(index *prefixindex.Index) error {
	var err error
	if g.peers, err = newPeerFetcher(g.opts, index, g.agentScheme); err != nil {
		return err
	}
	if g.warm, err = newWarmer(g.peers, g.Table, g.postWarm, g.opts.Registerer); err != nil {
		return err
	}
	if index != nil {
		g.prefixes = &prefixindex.Poller{Index: index, Log: g.opts.Log.WithName("prefixes"),
			Fetch: prefixindex.HTTPFetch{Transport: g.transport, Scheme: g.agentScheme, Prepare: g.toAgent}.Fetch}
		if g.warm != nil {
			g.prefixes.OnCold = g.warm.cold
		}
	}
	return nil
}

// NewTransport is the transport to agents: HTTP/1.1 (streams are independent
// connections, no head-of-line blocking), keep-alive pools sized for many concurrent
// streams per agent, no transparent compression (clients' Accept-Encoding passes
// through), a bounded connect time and no overall timeout (a generation lasts as long
// as it lasts; the client's disconnect ends it).
func NewTransport() *http.Transport {
	d := &net.Dialer{Timeout: DefaultConnectTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext:           d.DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ExpectContinueTimeout: 0,
		ForceAttemptHTTP2:     false,
	}
}

// Handler is the whole API.
func (g *Gateway) Handler() http.Handler { return g.handler }

// SetTable replaces the routing table and wakes requests waiting for a replica.
// Under RoutingPrefixCache it polls the prefix events of exactly the table's
// backends with a prompt cache.
func (g *Gateway) SetTable(t *Table) {
	old := g.table.Swap(t)
	if old != nil && old != t {
		g.adm.TableChanged(t)
		old.Replaced()
	}
	if g.prefixes != nil {
		var targets []prefixindex.Target
		for _, rt := range t.Routes() {
			if !rt.PromptCache {
				continue
			}
			for _, be := range rt.Backends {
				targets = append(targets, prefixindex.Target{Key: be.Key, Endpoint: be.Endpoint, Node: be.Node})
			}
		}
		g.prefixes.Sync(targets)
	}
}

// Close stops the gateway's background work (the polls of the prefix index).
func (g *Gateway) Close() {
	if g.prefixes != nil {
		g.prefixes.Close()
	}
	if g.warm != nil {
		g.warm.close()
	}
}

// toAgent readies a request of the gateway's own for t's agent: the fleet token, the
// gateway's id and the Mac whose certificate the connection must present.
func (g *Gateway) toAgent(r *http.Request, t prefixindex.Target) *http.Request {
	if tok := g.opts.FleetToken(); tok != "" {
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	r.Header.Set(mfv1.HeaderGateway, g.id)
	return r.WithContext(pki.WithNode(r.Context(), t.Node))
}

// Table is the current routing table.
func (g *Gateway) Table() *Table { return g.table.Load() }

func (g *Gateway) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/{path...}", g.handleProxy)
	mux.HandleFunc("GET /v1/models", g.handleListModels)
	mux.HandleFunc("GET /v1/models/{id...}", g.handleGetModel)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" || strings.HasPrefix(r.URL.Path, "/v1/models/") || strings.HasPrefix(r.URL.Path, "/v1/") {
			(&apiError{Status: http.StatusMethodNotAllowed, Type: openaierr.TypeInvalidRequest, Code: openaierr.CodeMethodNotAllowed,
				Message: r.Method + " is not allowed on " + r.URL.Path}).write(w)
			return
		}
		(&apiError{Status: http.StatusNotFound, Type: openaierr.TypeInvalidRequest, Code: openaierr.CodeNotFound,
			Message: "no such endpoint: " + r.Method + " " + r.URL.Path + " (the gateway serves the OpenAI API under /v1/)"}).write(w)
	})
	return mux
}

// authenticate requires a client API key, or a ServiceAccount token, when either is
// configured.
func (g *Gateway) authenticate(next http.Handler) http.Handler {
	if g.opts.Identify == nil && g.opts.ReviewToken == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, e := g.identify(r)
		if e != nil {
			g.count("", endpointLabel(r.URL.Path), e.Status, e.reason)
			e.write(w)
			return
		}
		// The handlers read who it is from the context (caller): the key is looked up
		// once per request.
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, id)))
	})
}

// identify is who presents r's key or ServiceAccount token, or the error to answer: a
// 401 for none or an unknown one, a 503 when a token could not be reviewed.
func (g *Gateway) identify(r *http.Request) (tenancy.Identity, *apiError) {
	key := clientKey(r)
	if key != "" && g.opts.Identify != nil {
		if id, ok := g.opts.Identify(key); ok {
			return id, nil
		}
	}
	unauthorized := func(msg string) *apiError {
		return &apiError{Status: http.StatusUnauthorized, Type: openaierr.TypeAuthentication, Code: openaierr.CodeInvalidAPIKey,
			Message: msg, reason: "unauthorized"}
	}
	switch {
	case key == "":
		return tenancy.Identity{}, unauthorized("missing API key: send it as Authorization: Bearer KEY (or x-api-key: KEY)")
	case g.opts.ReviewToken != nil && satoken.LooksLikeToken(key):
		id, err := g.opts.ReviewToken(satoken.WithSource(r.Context(), httpserver.SourceOf(r.RemoteAddr)), key)
		var refused *satoken.RefusedError
		var limited *satoken.LimitedError
		switch {
		case errors.As(err, &refused):
			return tenancy.Identity{}, unauthorized("invalid ServiceAccount token: " + refused.Reason +
				"; send a current token of an existing ServiceAccount, projected with this fleet's audience")
		case errors.As(err, &limited):
			return tenancy.Identity{}, &apiError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: openaierr.CodeTokenReviewLimited,
				Message: limited.Error(), RetryAfter: limited.RetryAfter, reason: "token_review_limited"}
		case err != nil:
			g.log.Error(err, "Reviewing a ServiceAccount token")
			return tenancy.Identity{}, &apiError{Status: http.StatusServiceUnavailable, Type: openaierr.TypeUnavailable, Code: openaierr.CodeTokenReview,
				Message:    "the ServiceAccount token could not be checked now (the TokenReview failed; it was logged); retry",
				RetryAfter: time.Second, reason: "token_review_failed"}
		}
		return id, nil
	}
	return tenancy.Identity{}, unauthorized("invalid API key: send a key of this fleet as Authorization: Bearer KEY (or x-api-key: KEY)")
}

// callerKey is the context key of the identity authenticate found.
type callerKey struct{}

// caller is who sent r, as authenticate found it. Without client auth every caller
// is an admin (it sees every namespace); with it, a request authenticate did not
// see may use nothing.
func (g *Gateway) caller(r *http.Request) tenancy.Identity {
	if g.opts.Identify == nil && g.opts.ReviewToken == nil {
		return tenancy.Identity{Admin: true}
	}
	id, _ := r.Context().Value(callerKey{}).(tenancy.Identity)
	return id
}

// clientKey is the API key a request presents: "Authorization: Bearer KEY", or
// "x-api-key: KEY" as Anthropic clients send it; "" when none.
func clientKey(r *http.Request) string {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return r.Header.Get("X-Api-Key")
	}
	key, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		return ""
	}
	return key
}

// recoverer turns a handler panic into a logged 500 when nothing was sent yet, so one
// request never takes the gateway down; a panic after the status aborts the response.
func (g *Gateway) recoverer(next http.Handler) http.Handler {
	return openaierr.Recover(next, g.log, "internal error in the gateway; it was logged")
}

// count records a finished request.
func (g *Gateway) count(model, endpoint string, status int, reason string) {
	g.metrics.requests.WithLabelValues(model, endpoint, statusLabel(status)).Inc()
	if reason != "" {
		g.metrics.errors.WithLabelValues(model, reason).Inc()
	}
}

func statusLabel(code int) string { return strconv.Itoa(code) }

// newGatewayID is a random id for this gateway process: agents keep the latest queue
// length per id, so several gateway replicas' queues add up.
func newGatewayID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

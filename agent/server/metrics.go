package server

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/tracing"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// metrics are the agent's request metrics, recorded by the handlers. The pool's own
// metrics (memory gauges, pressure level, loads, unloads, freed bytes, evictions,
// per-model state) come from enginepool.NewMetrics, registered next to them.
type metrics struct {
	requests        *prometheus.CounterVec
	ttft            *prometheus.HistogramVec
	generatedTokens *prometheus.CounterVec
	tokensPerSecond *prometheus.HistogramVec
	// prefixEvents counts the prefix events relayed from the runners to the gateways.
	prefixEvents *prometheus.CounterVec
	// usage counts the answers to in-cluster callers served directly, as the
	// gateway counts its callers' (macfleet_usage_*_total).
	usage *metering.Meter
}

func newMetrics(reg prometheus.Registerer, pool *enginepool.Pool) (*metrics, error) {
	m := newRequestMetrics()
	for _, c := range []prometheus.Collector{m.requests, m.ttft, m.generatedTokens, m.tokensPerSecond, m.prefixEvents,
		m.usage.Requests, m.usage.Tokens, enginepool.NewMetrics(pool)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func newRequestMetrics() *metrics {
	return &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_agent_requests_total",
			Help: "OpenAI requests answered by the node agent, by served model and HTTP status (499: the client went away first).",
		}, []string{"model", "code"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "macfleet_agent_ttft_seconds",
			Help:    "Time from a streamed request's arrival to its first event sent to the client.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14), // 5ms .. ~41s
		}, []string{"model"}),
		generatedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_agent_generated_tokens_total",
			Help: "Completion tokens generated, by served model.",
		}, []string{"model"}),
		tokensPerSecond: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "macfleet_agent_tokens_per_second",
			Help: "Decode rate of each completion: tokens after the first over the time after the first event " +
				"(streams), or tokens over the whole request (non-streamed).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14), // 1 .. 8192 tokens/s
		}, []string{"model"}),
		prefixEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_agent_prefix_events_total",
			Help: "Prefix events (a digest held, moved to the SSD or dropped) relayed from a model's runner on /api/models/{id}/prefixes, full listings included.",
		}, []string{"model"}),
		usage: metering.NewMeter(),
	}
}

// observeGeneration records a finished completion of n tokens. For a stream, d runs
// from the first event to the end and the first token is not counted in the rate;
// otherwise d is the whole request.
func (m *metrics) observeGeneration(model string, n int, d time.Duration, stream bool) {
	if n <= 0 {
		return
	}
	m.generatedTokens.WithLabelValues(model).Add(float64(n))
	rateTokens := n
	if stream {
		rateTokens = n - 1
	}
	if rateTokens > 0 && d > 0 {
		m.tokensPerSecond.WithLabelValues(model).Observe(float64(rateTokens) / d.Seconds())
	}
}

func (s *Server) metricsHandler() http.Handler {
	h := promhttp.HandlerFor(s.opts.Gatherer, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The prompt cache and split link counters are read from the runners at scrape time.
		s.pool.RefreshPromptCacheStats()
		h.ServeHTTP(w, r)
	})
}

// reqInfo follows one OpenAI request for its metrics and log line.
type reqInfo struct {
	start time.Time
	model string
	// usage is what the runner's answers to the request used (metered: it reported
	// any), sent back as the metering.Header trailer.
	usage   metering.Usage
	metered bool
	// caller and deployment, when set, are whom the usage is counted for and under
	// which deployment: a caller that is not an admin, served directly (acquire).
	caller     *tenancy.Identity
	deployment string
}

func (i *reqInfo) addUsage(u metering.Usage) {
	i.usage, i.metered = i.usage.Add(u), true
}

type reqInfoKey struct{}

// requestInfo returns the request's info (a throwaway one outside instrument).
func requestInfo(ctx context.Context) *reqInfo {
	if i, ok := ctx.Value(reqInfoKey{}).(*reqInfo); ok {
		return i
	}
	return &reqInfo{start: time.Now()}
}

// instrument counts an OpenAI request by model and status and logs it.
func (s *Server) instrument(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := &reqInfo{start: time.Now()}
		sw := &openaierr.StatusWriter{ResponseWriter: w}
		r, span := tracing.StartServer(s.tracer, r, "agent")
		r = r.WithContext(context.WithValue(r.Context(), reqInfoKey{}, info))
		// The usage goes in a trailer, declared before anything is written (a stream's
		// usage is known only at its end): every answer is sent chunked.
		w.Header().Set("Trailer", metering.Header)
		h(sw, r)
		if info.metered {
			w.Header().Set(metering.Header, info.usage.String())
			if info.caller != nil {
				s.metrics.usage.Record(*info.caller, info.deployment, info.usage)
			}
		}
		code := sw.Status
		if code == 0 {
			code = openaierr.StatusClientGone // nothing sent: the client went away first
		}
		endServerSpan(span, info.model, code)
		s.metrics.requests.WithLabelValues(info.model, strconv.Itoa(code)).Inc()
		if log := s.log.V(2); log.Enabled() {
			log.Info("Request", "method", r.Method, "path", r.URL.Path, "model", info.model,
				"status", code, "duration", time.Since(info.start).Round(time.Microsecond), "traceID", tracing.LogTraceID(r))
		}
	})
}

package gateway

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/gateway/metering"
)

// metrics are the gateway's Prometheus series. The model label is the deployment's
// "<namespace>/<name>" (bounded by the deployments that exist), or "" for requests
// that named no deployment.
type metrics struct {
	requests *prometheus.CounterVec
	errors   *prometheus.CounterVec
	ttft     *prometheus.HistogramVec
	inflight *prometheus.GaugeVec
	retries  *prometheus.CounterVec
	held     *prometheus.HistogramVec
	wakes    *prometheus.CounterVec

	queueDepth    *prometheus.GaugeVec
	queueWait     *prometheus.HistogramVec
	queueRejected *prometheus.CounterVec
	cancellations *prometheus.CounterVec
	routing       *prometheus.CounterVec
	continuations *prometheus.CounterVec
	// countDisagreements: streams whose usage report is not the gateway's own count.
	countDisagreements *prometheus.CounterVec
	// usageRelayed: streams metered at the gateway's own count, for want of a report.
	usageRelayed *prometheus.CounterVec

	// usage counts requests and tokens per key, namespace and deployment;
	// usageClamped the replicas' usage reports cut to their bound or refused.
	usage        *metering.Meter
	usageClamped *prometheus.CounterVec

	// budgetAdmissions counts the TokenBudget decisions; budgetReserved the tokens
	// the admitted requests in flight reserved.
	budgetAdmissions *prometheus.CounterVec
	budgetReserved   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{}
	m.newRequestMetrics()
	m.newQueueMetrics()
	m.newStreamMetrics()
	m.usageClamped, m.budgetAdmissions, m.budgetReserved = tenantMetrics()
	if err := m.register(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// newRequestMetrics makes the series of requests, their errors, times to the first
// byte, retries, holds and wakes.
func (m *metrics) newRequestMetrics() {
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_requests_total",
		Help: "Requests answered by the gateway, by deployment (namespace/name), endpoint (chat_completions, completions, " +
			"embeddings, responses, messages, other) and HTTP status (499: the client went away).",
	}, []string{"model", "endpoint", "code"})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_errors_total",
		Help: "Requests that failed, by deployment and reason (model_not_found, ambiguous_model, bad_request, " +
			"body_too_large, unauthorized, starting, no_ready_replica, wake_failed, queue_full, queue_full_client, queue_timeout, " +
			"budget_exceeded, token_review_limited, token_review_failed, upstream_unavailable, upstream_connect, stream_broken, client_gone).",
	}, []string{"model", "reason"})
	m.ttft = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "macfleet_gateway_ttft_seconds",
		Help: "Time from a request's arrival to the first byte of its response body sent to the client " +
			"(the first event of a stream), including holds and retries.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
	}, []string{"model", "endpoint"})
	m.inflight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "macfleet_gateway_inflight",
		Help: "Requests in flight through the gateway (held or proxied), by deployment.",
	}, []string{"model"})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_upstream_retries_total",
		Help: "Attempts that failed before the first byte and were retried (reason connect, status_503, status_507, transport).",
	}, []string{"model", "reason"})
	m.held = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "macfleet_gateway_hold_seconds",
		Help:    "Time requests waited for a routable replica (cold starts), by deployment; only requests that waited.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
	}, []string{"model"})
	m.wakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_wakes_total",
		Help: "Writes of the wake annotation that asks the autoscaler for a replica of an autoscaled deployment " +
			"with held requests, by deployment and result (written, error).",
	}, []string{"model", "result"})
}

// newQueueMetrics makes the series of the fair queue and of cancelled answers.
func (m *metrics) newQueueMetrics() {
	m.queueDepth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "macfleet_gateway_queue_depth",
		Help: "Requests waiting in the gateway's fair queue for a replica with room, by deployment and priority (interactive, batch).",
	}, []string{"model", "priority"})
	m.queueWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "macfleet_gateway_queue_wait_seconds",
		Help:    "Time requests waited in the fair queue before a replica took them (or they gave up), by deployment and priority; only requests that waited.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
	}, []string{"model", "priority"})
	m.queueRejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_queue_rejections_total",
		Help: "Requests the fair queue turned away, by deployment, priority and reason (queue_full: 429, the deployment's queue is full; " +
			"queue_full_client: 429, the client has its most requests waiting; queue_timeout: 503, no replica had room in time).",
	}, []string{"model", "priority", "reason"})
	m.cancellations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_cancellations_total",
		Help: "Answers whose client went away before their end, by deployment and outcome (metered: the runner ended the " +
			"answer and its usage was counted; not_running: no runner was generating it yet, dropped; timed_out: it did not " +
			"end within the cancel grace, dropped, a stream metered at the gateway's count; failed: the agent could not be asked, dropped, likewise).",
	}, []string{"model", "outcome"})
}

// newStreamMetrics makes the series of routing decisions, stream continuations and
// usage count disagreements.
func (m *metrics) newStreamMetrics() {
	m.routing = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_routing_decisions_total",
		Help: "Replicas given to requests, by deployment and how they were picked (prefix_hit: the replica holding the " +
			"longest prefix of the conversation by the prefix index; prefix_inflight: the replica a request of the same prefix was routed to " +
			"and is prefilling it, nobody holding it yet; fallback: no replica held any, by affinity on its prompt_cache_key or by least load; " +
			"prefix_affinity; least_load).",
	}, []string{"model", "routing"})
	m.continuations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_stream_continuations_total",
		Help: "Chat and text completion, Responses and Messages streams whose replica failed after the first byte, by deployment and outcome (continued: " +
			"another replica continued the answer in the same stream; not continued, with the replica's error as the last " +
			"event: limit, the stream was continued as often as allowed; deadline, no replica took it in time; finished, it " +
			"had its finish_reason; tool_call, it had sent a tool call; reasoning, a Responses stream had sent reasoning; unsupported, n > 1 uncounted, " +
			"a Messages request that starts the answer itself, or a text completion; refused, a replica refused the continuation with a 400; disabled; " +
			"too_long, it had sent more than the 8 MiB of answer the gateway keeps to continue a stream).",
	}, []string{"model", "outcome"})
	m.countDisagreements = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_usage_count_disagreements_total",
		Help: "Chat and text completion, Responses and Messages streams whose replica reported (X-Macfleet-Usage) other completion tokens than the gateway " +
			"counted in the events it forwarded, by deployment.",
	}, []string{"model"})
	m.usageRelayed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_usage_relayed_total",
		Help: "Chat and text completion, Responses and Messages streams metered at the gateway's own count of the tokens it read, " +
			"for want of their replica's usage report (the stream broke and was not continued, or its client went away and the " +
			"answer was dropped before its end), by deployment.",
	}, []string{"model"})
}

// register registers m's collectors with reg (see register).
func (m *metrics) register(reg prometheus.Registerer) error {
	var err error
	reg1 := func(c prometheus.Collector) prometheus.Collector {
		if err != nil {
			return c
		}
		var got prometheus.Collector
		got, err = register(reg, c)
		return got
	}
	m.requests = reg1(m.requests).(*prometheus.CounterVec)
	m.errors = reg1(m.errors).(*prometheus.CounterVec)
	m.ttft = reg1(m.ttft).(*prometheus.HistogramVec)
	m.inflight = reg1(m.inflight).(*prometheus.GaugeVec)
	m.retries = reg1(m.retries).(*prometheus.CounterVec)
	m.held = reg1(m.held).(*prometheus.HistogramVec)
	m.wakes = reg1(m.wakes).(*prometheus.CounterVec)
	m.queueDepth = reg1(m.queueDepth).(*prometheus.GaugeVec)
	m.queueWait = reg1(m.queueWait).(*prometheus.HistogramVec)
	m.queueRejected = reg1(m.queueRejected).(*prometheus.CounterVec)
	m.cancellations = reg1(m.cancellations).(*prometheus.CounterVec)
	m.routing = reg1(m.routing).(*prometheus.CounterVec)
	m.continuations = reg1(m.continuations).(*prometheus.CounterVec)
	m.countDisagreements = reg1(m.countDisagreements).(*prometheus.CounterVec)
	m.usageRelayed = reg1(m.usageRelayed).(*prometheus.CounterVec)
	m.usageClamped = reg1(m.usageClamped).(*prometheus.CounterVec)
	m.budgetAdmissions = reg1(m.budgetAdmissions).(*prometheus.CounterVec)
	m.budgetReserved = reg1(m.budgetReserved).(prometheus.Gauge)
	m.usage = metering.NewMeter()
	m.usage.Requests = reg1(m.usage.Requests).(*prometheus.CounterVec)
	m.usage.Tokens = reg1(m.usage.Tokens).(*prometheus.CounterVec)
	return err
}

// tenantMetrics are the series of what the gateway counts against its callers: the
// usage reports it cut, and the TokenBudget decisions and reservations.
func tenantMetrics() (usageClamped, budgetAdmissions *prometheus.CounterVec, budgetReserved prometheus.Gauge) {
	usageClamped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_usage_clamped_total",
		Help: "Usage reports of replicas (X-Macfleet-Usage) the gateway did not believe whole, by deployment and reason: " +
			"input_over_bound (more input than the request's sequences hold: a slot of the replica's contextLength each), " +
			"output_over_bound (more output than its choices' max_tokens, or their context), cached_over_input, " +
			"each counted at the bound; unreadable (a negative or malformed count): not counted.",
	}, []string{"model", "reason"})
	budgetAdmissions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "macfleet_gateway_budget_admissions_total",
		Help: "Team requests checked against their TokenBudgets, by outcome (admitted: its most tokens were reserved; " +
			"capped: admitted with each choice's max_tokens lowered to the room left in a window, the answer's " +
			"X-Macfleet-Budget-Capped says to what; budget_exceeded: 429, not even its prompt's estimate and a token a " +
			"choice fit a window; budget_lease: 503, its budget's lease could not be written).",
	}, []string{"outcome"})
	budgetReserved = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "macfleet_gateway_budget_reserved_tokens",
		Help: "Tokens reserved against TokenBudgets by the team requests in flight through this gateway (each its prompt's " +
			"estimate plus max_tokens × n, capped to the room left), released to their reported usage when they end.",
	})
	return usageClamped, budgetAdmissions, budgetReserved
}

// register adds c to reg, or returns the identical collector a previous gateway in
// this process registered (a gateway restarted in the same process keeps counting).
func register(reg prometheus.Registerer, c prometheus.Collector) (prometheus.Collector, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok &&
		fmt.Sprintf("%T", are.ExistingCollector) == fmt.Sprintf("%T", c) {
		return are.ExistingCollector, nil
	}
	return nil, fmt.Errorf("registering the gateway's metrics: %w", err)
}

// endpointLabel names an API path for the metrics; any other path is "other", so the
// label stays bounded.
func endpointLabel(path string) string {
	switch path {
	case "/v1/chat/completions":
		return "chat_completions"
	case "/v1/completions":
		return "completions"
	case "/v1/embeddings":
		return "embeddings"
	case "/v1/responses":
		return "responses"
	case "/v1/messages":
		return "messages"
	case "/v1/messages/count_tokens":
		return "messages_count_tokens"
	}
	return "other"
}

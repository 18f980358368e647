package autoscaler

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metric names, served by the manager's metrics endpoint. The deployment label is
// "<namespace>/<name>" of an autoscaled deployment.
const (
	MetricInFlight    = "macfleet_autoscaler_inflight_requests"
	MetricRecommended = "macfleet_autoscaler_recommended_replicas"
	MetricScales      = "macfleet_autoscaler_scales_total"
	MetricAPIWrites   = "macfleet_autoscaler_api_writes_total"
)

var (
	inflight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricInFlight,
		Help: "Requests in flight (and held) on an autoscaled deployment at its last load measurement: their mean since the previous one, rounded up.",
	}, []string{"deployment"})
	recommended = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricRecommended,
		Help: "Replicas the autoscaler last recommended for a deployment.",
	}, []string{"deployment"})
	scales = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricScales,
		Help: "Changes of spec.replicas written by the autoscaler, by direction (up, down).",
	}, []string{"deployment", "direction"})
	apiWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricAPIWrites,
		Help: "Writes to the API server by the autoscaler (spec: spec.replicas; status: status.autoscaling and the Autoscaling condition), Events excluded.",
	}, []string{"deployment", "kind"})
)

// The metrics are process-wide: registered once, shared by every Reconciler (tests run
// several managers in one process).
func init() {
	metrics.Registry.MustRegister(inflight, recommended, scales, apiWrites)
}

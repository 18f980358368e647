package scheduler

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metric names, served by the manager's metrics endpoint next to controller-runtime's.
const (
	MetricSolveDuration         = "macfleet_scheduler_solve_duration_seconds"
	MetricSchedulingLatency     = "macfleet_scheduler_scheduling_latency_seconds"
	MetricUnschedulableReplicas = "macfleet_scheduler_unschedulable_replicas"
	MetricBindingsTotal         = "macfleet_scheduler_bindings_total"
)

var (
	// solveDuration is the time one Solve over the whole fleet takes (snapshot
	// building and writes excluded).
	solveDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: MetricSolveDuration,
		Help: "Time one placement solve over the whole fleet took, in seconds.",
		// 100µs … ~3.3s.
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	})
	// schedulingLatency is, per bound replica, the time from its creation (as first
	// seen by the scheduler's informer; its creationTimestamp if it existed before the
	// scheduler started) until its binding was written.
	schedulingLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: MetricSchedulingLatency,
		Help: "Time from a ModelReplica's creation until the scheduler bound it to a MacNode, in seconds.",
		// 5ms … ~164s.
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
	})
	// unschedulableReplicas is the number of pending replicas the last solve could not
	// place.
	unschedulableReplicas = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricUnschedulableReplicas,
		Help: "Pending ModelReplicas that no MacNode fits, as of the last solve.",
	})
	// bindingsTotal counts bindings written successfully.
	bindingsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: MetricBindingsTotal,
		Help: "ModelReplicas bound to a MacNode by the scheduler.",
	})
)

// The metrics are process-wide: registered once, shared by every Reconciler (tests run
// several managers in one process).
func init() {
	metrics.Registry.MustRegister(solveDuration, schedulingLatency, unschedulableReplicas, bindingsTotal)
}

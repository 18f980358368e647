package macnode

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// MetricReady is the MacNode Ready gauge, served by the manager's metrics endpoint.
const MetricReady = "macfleet_macnode_ready"

// readyGauge is 1 for a MacNode whose Ready condition is True, 0 otherwise (False, Unknown
// after its Lease expired, or not yet reported), as of the controller's last look.
var readyGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: MetricReady,
	Help: "1 when the MacNode's Ready condition is True, else 0 (its agent's Lease expired, or it reported not ready).",
}, []string{"macnode"})

// Process-wide, like the scheduler's: tests run several managers in one process.
func init() { metrics.Registry.MustRegister(readyGauge) }

// observeReady records node's Ready condition.
func observeReady(node *v1alpha1.MacNode) {
	v := 0.0
	if meta.IsStatusConditionTrue(node.Status.Conditions, v1alpha1.MacNodeReady) {
		v = 1
	}
	readyGauge.WithLabelValues(node.Name).Set(v)
}

// forgetReady drops a deleted MacNode's series.
func forgetReady(name string) { readyGauge.DeleteLabelValues(name) }

package modeldeployment

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// Bounds, in percent of the measured footprint, of what a new replica reserves once
// a replica of the same model and engine settings has reported its footprint.
//
// The floor keeps every new replica at least 10% above the largest footprint a
// replica measured: a runner's own ceiling is its reservation plus 10%, and the
// enforcer takes a runner more than 10% over its reservation for a pressure victim,
// so one that peaks where the last one did is refused or evicted by neither. When the
// estimate is below the floor, the measurement wins.
//
// The cap lets the measurement pull a generous estimate down to 30% above it: what a
// runner holds can still grow after its footprint was read — compute-buffer pages a
// long prompt touches first, a larger output buffer for an embedding input — by up to
// 1.3× between a freshly loaded runner and the peak of a full context in the
// estimate's tests (the tiny model on the CPU backend). Below the cap, the estimate
// (at most 1.3× the peak for the models docs/benchmarks.md lists) is kept.
const (
	measuredFloorPercent = 110
	measuredCapPercent   = 130
)

// sameFootprint says whether replicas of templates a and b hold the same memory: the
// same model file and the same engine settings. The rest of the template hash —
// served name, aliases, residency, idle timeout — changes nothing a runner allocates,
// so a rollout of an alias keeps the measurement; a new model or context does not.
func sameFootprint(a, b *v1alpha1.ModelReplicaTemplate) bool {
	return a.Model.Source == b.Model.Source && a.Model.SHA256 == b.Model.SHA256 &&
		equality.Semantic.DeepEqual(a.Engine, b.Engine)
}

// measuredFootprint is the largest footprint — peak, or resident where that is
// larger — that a loaded replica with tmpl's footprint reports (the agent reports
// both while the model is loaded); ok is false when none does.
func measuredFootprint(tmpl v1alpha1.ModelReplicaTemplate, replicas []v1alpha1.ModelReplica) (bytes int64, ok bool) {
	for i := range replicas {
		r := &replicas[i]
		if !sameFootprint(&tmpl, &r.Spec.Template) {
			continue
		}
		for _, q := range []*resource.Quantity{r.Status.Memory.Peak, r.Status.Memory.Resident} {
			if q != nil && q.Value() > 0 {
				bytes, ok = max(bytes, q.Value()), true
			}
		}
	}
	return bytes, ok
}

// withMeasurement returns the reservation for new replicas of tmpl: res, an estimate,
// moved into [floor, cap] of the footprint a loaded replica of the same footprint
// measured, rounded up to whole MiB. An explicit reservation, an unknown one, or no
// measurement leaves res as it is.
func withMeasurement(res reservation, tmpl v1alpha1.ModelReplicaTemplate, replicas []v1alpha1.ModelReplica) reservation {
	if res.Quantity == nil || res.Explicit {
		return res
	}
	m, ok := measuredFootprint(tmpl, replicas)
	if !ok {
		return res
	}
	floor, capped := m*measuredFloorPercent/100, m*measuredCapPercent/100
	res.Quantity = roundUpMiB(max(floor, min(res.Quantity.Value(), capped)))
	res.Measured = m
	return res
}

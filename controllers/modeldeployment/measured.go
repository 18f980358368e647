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
// same model file, the same projector and draft model beside it (a runner loads both
// into its own memory) and the same engine settings. The rest of the template hash —
// served name, aliases, residency, idle timeout — changes nothing a runner allocates,
// so a rollout of an alias keeps the measurement; a new model, projector, draft or
// context does not.
func sameFootprint(a, b *v1alpha1.ModelReplicaTemplate) bool {
	return equality.Semantic.DeepEqual(footprintModel(a.Model), footprintModel(b.Model)) && equality.Semantic.DeepEqual(a.Engine, b.Engine)
}

// footprintModel is the part of a model source that sets what a runner holds: the
// files and their checksums.
func footprintModel(m v1alpha1.ModelSource) v1alpha1.ModelSource {
	return v1alpha1.ModelSource{Source: m.Source, SHA256: m.SHA256, Projector: m.Projector, ProjectorSHA256: m.ProjectorSHA256,
		Draft: m.Draft, DraftSHA256: m.DraftSHA256}
}

// footprintHash names what a measurement is of: tmpl's model files and engine
// settings, the part of the template sameFootprint compares.
func footprintHash(tmpl v1alpha1.ModelReplicaTemplate) string {
	return templateHash(v1alpha1.ModelReplicaTemplate{Model: footprintModel(tmpl.Model), Engine: tmpl.Engine})
}

// measuredFootprint is the largest footprint — peak, or resident where that is
// larger — measured for tmpl's model and engine settings: by a loaded replica with
// tmpl's footprint (the agent reports both while the model is loaded), or earlier, as
// status kept it (its measuredMemory, when measuredFootprintHash is tmpl's). ok is
// false when there is neither. A replica split across Macs measures nothing here: its
// status.memory is its head's process alone, not the whole model's footprint, and
// placing its replacement by it would put the whole model on one Mac too small for it.
func measuredFootprint(tmpl v1alpha1.ModelReplicaTemplate, replicas []v1alpha1.ModelReplica, st *v1alpha1.ModelDeploymentStatus) (bytes int64, ok bool) {
	if st.MeasuredMemory != nil && st.MeasuredFootprintHash == footprintHash(tmpl) && st.MeasuredMemory.Value() > 0 {
		bytes, ok = st.MeasuredMemory.Value(), true
	}
	for i := range replicas {
		r := &replicas[i]
		if !sameFootprint(&tmpl, &r.Spec.Template) || r.Spec.Split != nil {
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

// withMeasurement returns the reservation for new replicas: res, an estimate, moved
// into [floor, cap] of measured, the footprint measured for the same model and
// engine settings (0: none), rounded up to whole MiB. An explicit reservation, an
// unknown one, or no measurement leaves res as it is.
func withMeasurement(res reservation, measured int64) reservation {
	if res.Quantity == nil || res.Explicit || measured <= 0 {
		return res
	}
	floor, capped := measured*measuredFloorPercent/100, measured*measuredCapPercent/100
	res.Quantity = roundUpMiB(max(floor, min(res.Quantity.Value(), capped)))
	res.Measured = measured
	return res
}

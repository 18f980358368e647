package modeldeployment

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/scheduler"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/modelsource"
)

const qwen3NextRefusal = "its recurrent layers keep a state beside the attention cache (qwen3next), which split workers do not compute"

// TestByLayerRefusesRecurrentModels: the estimate of a model whose layers keep a
// recurrent state (a hybrid, a recurrent architecture) gives no layers to split and
// says why; a decoder's gives its layers; a header without layers gives none and no
// refusal.
func TestByLayerRefusesRecurrentModels(t *testing.T) {
	for _, tc := range []struct {
		arch       string
		layers     int64
		wantLayers bool
		want       string
	}{
		{"llama", 48, true, ""},
		{"qwen3moe", 48, true, ""},
		{"gpt-oss", 24, true, ""},
		{"llama", 0, false, ""},
		{"qwen3next", 48, false, qwen3NextRefusal},
		{"mamba", 64, false, "its layers keep a recurrent state (mamba), which split workers do not compute"},
	} {
		est := gangEstimate()
		est.Dims.Architecture, est.Dims.Layers = tc.arch, tc.layers
		l, why := byLayer(&est)
		if (l != nil) != tc.wantLayers || why != tc.want {
			t.Errorf("%s of %d layers: layers %+v, refusal %q; want layers %v, refusal %q", tc.arch, tc.layers, l, why, tc.wantLayers, tc.want)
		}
	}
}

// TestReservationOfAnUnsplittableModel: a deployment that may span Macs gets no
// layers for a qwen3next model, with the refusal, whether its memory is estimated or
// set; one that may not span Macs carries neither.
func TestReservationOfAnUnsplittableModel(t *testing.T) {
	est := gangEstimate()
	est.Dims.Architecture = "qwen3next"
	r := &Reconciler{
		Clock: clocktesting.NewFakePassiveClock(time.Now()), Resolver: &modelsource.Resolver{},
		EstimateTimeout: time.Second, EstimateRetryInitial: time.Second, EstimateRetryMax: time.Second,
		Estimate: func(context.Context, estimate.Params) (estimate.Result, error) { return est, nil },
	}
	set := resource.MustParse("60Gi")
	for _, tc := range []struct {
		name    string
		maxMacs int32
		memory  *resource.Quantity
		want    string
	}{
		{"estimated, may span 2", 2, nil, qwen3NextRefusal},
		{"set, may span 3", 3, &set, qwen3NextRefusal},
		{"estimated, one Mac", 1, nil, ""},
		{"set, one Mac", 0, &set, ""},
	} {
		md := deployment(func(md *v1alpha1.ModelDeployment) {
			md.Spec.Placement.MaxMacsPerReplica = tc.maxMacs
			if tc.memory != nil {
				md.Spec.Resources = &v1alpha1.ModelResources{Memory: tc.memory}
			}
		})
		res := r.reservationFor(t.Context(), md, replicaTemplate(md))
		if res.Err != nil || res.Quantity == nil || res.Layers != nil || res.SplitRefusal != tc.want {
			t.Errorf("%s: quantity %v, layers %+v, refusal %q, error %v; want a quantity, no layers and refusal %q",
				tc.name, res.Quantity, res.Layers, res.SplitRefusal, res.Err, tc.want)
		}
	}
}

// TestScheduledConditionOfAnUnsplittableModel: a replica no Mac holds, of a model
// that may not be split, makes Scheduled False with SplitUnsupported, naming the
// reason and the fix; other reasons a replica waits keep theirs; replicas placed
// whole say that the split was not used; without a refusal nothing changes.
func TestScheduledConditionOfAnUnsplittableModel(t *testing.T) {
	const tooLarge = "0/2 Macs fit: 2 insufficient memory (need 49.3GiB, largest free 32.0GiB)"
	insufficient := func(mr *v1alpha1.ModelReplica) {
		meta.SetStatusCondition(&mr.Status.Conditions, metav1.Condition{Type: v1alpha1.ReplicaScheduled, Status: metav1.ConditionFalse,
			Reason: string(scheduler.ReasonInsufficientMemory), Message: tooLarge})
	}
	q := resource.MustParse("50488Mi")
	for _, tc := range []struct {
		name      string
		replica   v1alpha1.ModelReplica
		refusal   string
		want, msg string
	}{
		{"too large, unsplittable", replica("a", "h", insufficient), qwen3NextRefusal,
			"False/SplitUnsupported", "1 of 1 replicas unschedulable: " + tooLarge +
				"; placement.maxMacsPerReplica 2 is not used: a split of this model across Macs is refused: " + qwen3NextRefusal +
				"; serve it on one Mac: one with the replica's 49.3 GiB free, or lower its memory with a smaller quant or a shorter engine.contextLength"},
		{"too large, splittable", replica("a", "h", insufficient), "",
			"False/InsufficientMemory", "1 of 1 replicas unschedulable: " + tooLarge},
		{"not ready Macs, unsplittable", replica("a", "h", unschedulable("0/2 Macs fit: 2 not ready")), qwen3NextRefusal,
			"False/Unschedulable", "1 of 1 replicas unschedulable: 0/2 Macs fit: 2 not ready"},
		{"placed whole", replica("a", "h", bound("m1"), ready), qwen3NextRefusal,
			"True/AllReplicasScheduled", "all 1 replicas bound to a Mac, each whole (placement.maxMacsPerReplica 2 is not used: " +
				"a split of this model across Macs is refused: " + qwen3NextRefusal + ")"},
	} {
		md := deployment(func(md *v1alpha1.ModelDeployment) { md.Spec.Placement.MaxMacsPerReplica = 2 })
		setStatus(md, summarize([]v1alpha1.ModelReplica{tc.replica}, byHash("h")),
			statusInput{Desired: 1, Reservation: &q, Now: time.Now(), SplitRefusal: tc.refusal})
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentScheduled)
		if got := string(c.Status) + "/" + c.Reason; got != tc.want || c.Message != tc.msg {
			t.Errorf("%s: Scheduled %s: %q\nwant %s: %q", tc.name, got, c.Message, tc.want, tc.msg)
		}
	}
}

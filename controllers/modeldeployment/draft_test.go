package modeldeployment

import (
	"fmt"
	"testing"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// TestEstimateCountsTheDraft: a deployment's draft model (spec.model.draft) is
// counted in its replicas' reservation: its own estimate for the model's engine
// settings (weights, KV cache for every slot), but the runner's baseline.
func TestEstimateCountsTheDraft(t *testing.T) {
	srv := newGGUFServer(t, true)
	f := newFixture(t)
	f.start(&Reconciler{Resolver: &modelsource.Resolver{HFEndpoint: srv.URL + "/hub"}})

	md := newDeployment("est-draft", srv.URL+"/model.gguf", 1, "")
	md.Spec.Engine.ContextLength = 2048
	md.Spec.Engine.Parallel = 2
	md.Spec.Model.Draft = "hf://macfleet/tiny/model.gguf" // the model as its own draft
	f.create(md)
	p := estimate.Params{Path: srv.path, ContextLength: 2 * 2048, Parallel: 2}
	model, err := estimate.Estimate(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	want := roundUpMiB(model.WithDraft(model.DraftBytes()).Total).String()
	if without := roundUpMiB(model.Total).String(); without == want {
		t.Fatalf("the draft adds nothing to %s: the test shows nothing", without)
	}
	got := f.waitStatus(md.Name, func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.EstimatedMemory != nil, fmt.Sprintf("%+v", md.Status)
	})
	if got.Status.EstimatedMemory.String() != want {
		t.Errorf("estimatedMemory %s, want %s (the model %d bytes and its draft %d)", got.Status.EstimatedMemory.String(), want, model.Total, model.DraftBytes())
	}
}

package standalone_test

import (
	"context"
	"testing"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/estimate"
)

// TestBuildSpecCountsTheDraft: a model's draft model starts its runner with --draft
// (DraftPath) and its memory, for the model's context and slots, is in the estimate.
func TestBuildSpecCountsTheDraft(t *testing.T) {
	path := tinyModel(t)
	m := config.Model{Name: "t", Path: path, Settings: engine.Settings{ContextLength: 1024, Parallel: 3, KVCacheType: "f16"}, Residency: "OnDemand"}
	bare, err := standalone.BuildSpec(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	m.Draft = path // the model as its own draft
	got, err := standalone.BuildSpec(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	draft, err := estimate.Draft(context.Background(), estimate.Params{Path: path, ContextLength: 3 * 1024, Parallel: 3, KVCacheType: "f16"})
	if err != nil || draft <= 0 {
		t.Fatalf("estimate.Draft = %d, %v", draft, err)
	}
	if got.DraftPath != path || bare.DraftPath != "" {
		t.Errorf("DraftPath %q (without a draft %q), want %q", got.DraftPath, bare.DraftPath, path)
	}
	if got.EstimatedBytes != bare.EstimatedBytes+draft {
		t.Errorf("EstimatedBytes %d, want the model's %d and the draft's %d", got.EstimatedBytes, bare.EstimatedBytes, draft)
	}
	m.Draft = path + ".missing"
	if _, err := standalone.BuildSpec(context.Background(), m); err == nil {
		t.Error("a missing draft model was accepted")
	}
}

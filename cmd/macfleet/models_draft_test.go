package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestModelsFitDraft: `models fit --draft` counts a draft model in every need: its
// own estimate at the need's context and slots but the runner's baseline
// (estimate.Draft), as the manager and the agent count it.
func TestModelsFitDraft(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBECONFIG", "")
	model := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := ggufsynth.Write(model, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	draftBytes, err := estimate.Draft(t.Context(), estimate.Params{Path: model, ContextLength: 2 * 4096, Parallel: 2})
	if err != nil || draftBytes <= 0 {
		t.Fatalf("the draft's estimate: %d bytes, %v", draftBytes, err)
	}
	args := []string{model, "--memory", "24Gi", "--context-length", "4096", "--parallel", "2"}
	bare := fitJSON(t, args...)
	rep := fitJSON(t, append(args, "--draft", model)...) // the model as its own draft
	if len(rep.Needs) != 1 || len(bare.Needs) != 1 || rep.Needs[0].Bytes != bare.Needs[0].Bytes+draftBytes {
		t.Errorf("needs %+v, want the model's %+v and the draft's %d bytes", rep.Needs, bare.Needs, draftBytes)
	}
	if d := rep.Model.Draft; d == nil || d.Source != model || d.Weights != rep.Model.Weights || bare.Model.Draft != nil {
		t.Errorf("draft %+v (without --draft %+v), want %s with the model's weights", d, bare.Model.Draft, model)
	}
	out, err := runFit(t, append(args, "--draft", model)...)
	if err != nil || !strings.Contains(out, "with its draft model "+model+": ") {
		t.Errorf("the table: %v, want it to name the draft model:\n%s", err, out)
	}
	if _, err := runFit(t, append(args, "--draft", "hf://org/m-GGUF/d-00001-of-00002.gguf")...); err == nil || !strings.Contains(err.Error(), "a draft model is one file") {
		t.Errorf("a draft in parts: %v", err)
	}
}

package runnerproc

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// TestDraftArgs: a model with a draft model starts its runner with --draft, part of
// the engine's arguments (a runner started without it is never adopted for a spec
// with it).
func TestDraftArgs(t *testing.T) {
	spec := enginepool.ModelSpec{Name: "m", Path: "/models/m.gguf", Engine: engine.Settings{ContextLength: 512, Parallel: 1}}
	drafted := spec
	drafted.DraftPath = "/models/draft.gguf"
	f := NewProcessFactory(ProcessConfig{Threads: 1})
	want := []string{"--ctx", "512", "--parallel", "1", "--threads", "1", "--alias", "m", "--draft", "/models/draft.gguf"}
	if d := cmp.Diff(want, f.engineArgs(drafted, 0)); d != "" {
		t.Errorf("engineArgs (-want +got):\n%s", d)
	}
	if slices.Contains(f.engineArgs(spec, 0), "--draft") {
		t.Errorf("a model without a draft got --draft: %v", f.engineArgs(spec, 0))
	}
}

package runnerproc

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// TestProjectorArgs: a model with a projector starts its runner with --mmproj, and
// the projector is part of the engine's fingerprint (a runner started without it is
// never adopted for a spec with it).
func TestProjectorArgs(t *testing.T) {
	spec := enginepool.ModelSpec{Name: "m", Path: "/models/m.gguf", Engine: engine.Settings{ContextLength: 512, Parallel: 1}}
	vision := spec
	vision.ProjectorPath = "/models/mmproj.gguf"
	f := NewProcessFactory(ProcessConfig{Threads: 1})
	want := []string{"--ctx", "512", "--parallel", "1", "--threads", "1", "--alias", "m", "--mmproj", "/models/mmproj.gguf"}
	if d := cmp.Diff(want, f.engineArgs(vision, 0)); d != "" {
		t.Errorf("engineArgs (-want +got):\n%s", d)
	}
	if slices.Contains(f.engineArgs(spec, 0), "--mmproj") {
		t.Errorf("a model without a projector got --mmproj: %v", f.engineArgs(spec, 0))
	}
	if args := f.runnerArgs(vision, 0, "/tmp/r.sock", "", nil); !slices.Contains(args, "--mmproj") || args[1] != "/models/m.gguf" {
		t.Errorf("runnerArgs %v", args)
	}
}

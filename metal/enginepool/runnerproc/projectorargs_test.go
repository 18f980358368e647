package runnerproc

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// TestProjectorArgs: a model with a projector starts its runner with --mmproj, one
// with a draft model with --draft, and each is part of the engine's fingerprint (a
// runner started without it is never adopted for a spec with it).
func TestProjectorArgs(t *testing.T) {
	spec := enginepool.ModelSpec{Name: "m", Path: "/models/m.gguf", Engine: engine.Settings{ContextLength: 512, Parallel: 1}}
	f := NewProcessFactory(ProcessConfig{Threads: 1})
	for _, tc := range []struct {
		flag, path string
		set        func(*enginepool.ModelSpec, string)
	}{
		{"--mmproj", "/models/mmproj.gguf", func(s *enginepool.ModelSpec, p string) { s.ProjectorPath = p }},
		{"--draft", "/models/draft.gguf", func(s *enginepool.ModelSpec, p string) { s.DraftPath = p }},
	} {
		with := spec
		tc.set(&with, tc.path)
		want := []string{"--ctx", "512", "--parallel", "1", "--threads", "1", "--alias", "m", tc.flag, tc.path}
		if d := cmp.Diff(want, f.engineArgs(with, 0)); d != "" {
			t.Errorf("%s: engineArgs (-want +got):\n%s", tc.flag, d)
		}
		if slices.Contains(f.engineArgs(spec, 0), tc.flag) {
			t.Errorf("a model without it got %s: %v", tc.flag, f.engineArgs(spec, 0))
		}
		if args := f.runnerArgs(with, 0, "/tmp/r.sock", "", nil); !slices.Contains(args, tc.flag) || args[1] != "/models/m.gguf" {
			t.Errorf("%s: runnerArgs %v", tc.flag, args)
		}
	}
}

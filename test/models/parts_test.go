package models_test

import (
	"path/filepath"
	"testing"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// partsCount is how many parts the tests store a model in.
const partsCount = 3

// TestStoredInPartsPerFamily serves each family's tiny model twice through `macfleet
// serve`: in one file, and stored in three parts (NAME-00001-of-00003.gguf, llama.cpp's
// split keys, the tensors divided among them) named by its first part. The runner of
// the parts loads from the first part and gives the one file's greedy tokens, to a
// prompt whose answer differs from another's (so that the comparison could fail); the
// pool's estimate counts every part, the one file's up to the parts' two more headers.
func TestStoredInPartsPerFamily(t *testing.T) {
	eachFamily(t, func(t *testing.T, bin string, m tinyModel) {
		arch := m.family.Arch()
		parts, err := ggufsynth.WriteParts(filepath.Join(m.dir, arch+"-parts"), m.spec, partsCount)
		if err != nil {
			t.Fatal(err)
		}
		if len(parts) != partsCount {
			t.Fatalf("%d parts written, want %d: %v", len(parts), partsCount, parts)
		}
		set := engine.Settings{ContextLength: matrixContext}
		cfg, err := config.Config{Runner: bin, RunnerThreads: 1, MemoryCeiling: 2 << 30, Listen: "127.0.0.1:0",
			PromptCacheDir: filepath.Join(t.TempDir(), "prompt-cache"), Models: []config.Model{
				{Name: "one", Path: m.path, Settings: set, Residency: config.ResidencyOnDemand},
				{Name: "parts", Path: parts[0], Settings: set, Residency: config.ResidencyOnDemand},
			}}.Complete()
		if err != nil {
			t.Fatal(err)
		}
		s := serve(t, cfg)

		want := s.stream("one", prompt, answerTokens)
		if o := s.stream("one", other, answerTokens); o.bytes == want.bytes {
			t.Fatalf("the answers to two prompts are alike (%q): a comparison could not fail", o.bytes)
		}
		s.action("one", "unload?wait=true")
		got := s.stream("parts", prompt, answerTokens)
		if got.bytes != want.bytes || got.prompt != want.prompt {
			t.Errorf("the model in %d parts answers %q (%d prompt tokens), the one file %q (%d)",
				partsCount, got.bytes, got.prompt, want.bytes, want.prompt)
		}
		one, inParts := s.model("one"), s.model("parts")
		if inParts.State != enginepool.StateReady || inParts.LoadedSpec == nil || inParts.LoadedSpec.Path != parts[0] {
			t.Errorf("the model in parts: state %s, loaded spec %+v; want Ready from the first part %s",
				inParts.State, inParts.LoadedSpec, parts[0])
		}
		if d := inParts.EstimatedBytes - one.EstimatedBytes; d < 0 || d > 1<<20 {
			t.Errorf("the estimate of the parts %d bytes, of the one file %d: want every part counted, the same up to two headers",
				inParts.EstimatedBytes, one.EstimatedBytes)
		}
		t.Logf("%s in %d parts: %q, estimate %d bytes (one file %d)", arch, partsCount, got.bytes, inParts.EstimatedBytes, one.EstimatedBytes)
	})
}

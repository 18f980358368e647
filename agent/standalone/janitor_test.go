package standalone_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// `macfleet serve` removes the prompt cache directory of a model file it no longer
// serves once idle past the retention, keeps the one of a configured model however
// old (it is not loaded: nothing claims it), and never touches a model file.
func TestServePrunesTheCacheDirsOfModelsGone(t *testing.T) {
	runner := os.Getenv(runnerproc.RunnerEnv)
	if runner == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	path := tinyModel(t)
	goneModel := filepath.Join(filepath.Dir(path), "gone.gguf")
	if err := os.WriteFile(goneModel, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	cacheDir := filepath.Join(t.TempDir(), "prompt-cache")
	old := time.Now().Add(-48 * time.Hour)
	mkOld := func(model string) string {
		d := filepath.Join(cacheDir, runnerproc.PromptCacheDirName("", model))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "state"), make([]byte, 100), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{filepath.Join(d, "state"), d} {
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	kept, gone := mkOld(path), mkOld(goneModel)
	cfg, err := config.Config{
		Runner: runner, RunnerThreads: 1, MemoryCeiling: 2 << 30, Listen: "127.0.0.1:0", PromptCacheDir: cacheDir,
		Models: []config.Model{{Name: "m", Path: path, Settings: engine.Settings{ContextLength: 512}, Residency: config.ResidencyOnDemand}},
	}.Complete()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- standalone.Run(ctx, cfg, standalone.Options{Log: funcr.New(logs.line, funcr.Options{}), Listener: ln,
			PromptCacheRetention: 24 * time.Hour, GCInterval: 50 * time.Millisecond, GCFirstDelay: time.Millisecond})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// The janitor logs after it removed the directories: wait for both, not just the
	// removal, or the check of the log below races the janitor's next line.
	waitFor(t, "the gone model's prompt cache directory to be removed and the removal logged", func() bool {
		_, err := os.Stat(gone)
		return os.IsNotExist(err) && strings.Contains(logs.String(), "Removed the prompt cache directories of models no longer in use")
	})
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("the configured model's prompt cache directory: %v, want it kept", err)
	}
	for _, p := range []string{path, goneModel} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("model file %s: %v", p, err)
		}
	}
	if !strings.Contains(logs.String(), "Removed the prompt cache directories of models no longer in use") {
		t.Errorf("nothing logged about the removal:\n%s", logs.String())
	}
}

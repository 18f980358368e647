package standalone_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// serving is one standalone.Run in the background.
type serving struct {
	t    *testing.T
	base string
	stop func()
	logs *syncBuffer
}

func serve(t *testing.T, cfg config.Config) *serving {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &serving{t: t, base: "http://" + ln.Addr().String(), logs: &syncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- standalone.Run(ctx, cfg, standalone.Options{Log: funcr.New(s.logs.line, funcr.Options{}), Listener: ln,
			Pool: enginepool.Config{DrainTimeout: time.Second, SettleTimeout: time.Second}})
	}()
	stopped := false
	s.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Errorf("Run did not return:\n%s", s.logs.String())
		}
	}
	t.Cleanup(s.stop)
	deadline := time.Now().Add(time.Minute)
	for {
		if resp, err := http.Get(s.base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after a minute:\n%s", s.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *serving) model(name string) enginepool.ModelSnapshot {
	s.t.Helper()
	resp, err := http.Get(s.base + "/api/status")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st server.StatusResponse
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		s.t.Fatal(err)
	}
	for _, m := range st.Models {
		if m.Name == name {
			return m
		}
	}
	s.t.Fatalf("no model %s", name)
	return enginepool.ModelSnapshot{}
}

func (s *serving) chat(model, content string) string {
	s.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 8, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	resp, err := http.Post(s.base+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	var out struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) == 0 {
		s.t.Fatalf("chat answer %s: %v", b, err)
	}
	return out.Choices[0].Message.Content
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A restarted `macfleet serve` finds the SSD tier its predecessor wrote: the first
// repeated prompt of the second run is an SSD hit, restored instead of prefilled, and
// answers like the first run did.
func TestRestartKeepsTheSSDTier(t *testing.T) {
	runner := os.Getenv(runnerproc.RunnerEnv)
	if runner == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	path := tinyModel(t)
	cacheDir := filepath.Join(t.TempDir(), "prompt-cache")
	hot := config.Size(64 << 20)
	cfg, err := config.Config{
		Runner: runner, RunnerThreads: 1, MemoryCeiling: 2 << 30, Listen: "127.0.0.1:0",
		PromptCacheDir: cacheDir, PromptCacheHotBytes: &hot,
		Models: []config.Model{{Name: "m", Path: path, Settings: engine.Settings{ContextLength: 2048}, Residency: config.ResidencyResident}},
	}.Complete()
	if err != nil {
		t.Fatal(err)
	}
	prompt := strings.Repeat("Once upon a time a small model told a long story about caches. ", 10)

	first := serve(t, cfg)
	want := first.chat("m", prompt)
	waitFor(t, "the state to be persisted on the SSD", func() bool {
		pc := first.model("m").PromptCache
		return pc != nil && pc.SavesPersisted >= 1
	})
	pc := first.model("m").PromptCache
	if wantDir := filepath.Join(cacheDir, runnerproc.PromptCacheDirName("", path)); !strings.HasPrefix(pc.SSDDir, wantDir+string(filepath.Separator)) {
		t.Fatalf("SSD dir %q, want one under %s", pc.SSDDir, wantDir)
	}
	first.stop()

	second := serve(t, cfg)
	if got := second.chat("m", prompt); got != want {
		t.Errorf("answer after the restore %q, want the first run's %q", got, want)
	}
	pc = second.model("m").PromptCache
	if pc == nil || pc.Hits < 1 || pc.HotHits != 0 || pc.Restores < 1 || pc.RestoredTokens < 64 {
		t.Fatalf("second run's prompt cache %+v; want the repeated prompt restored from an SSD hit", pc)
	}
	t.Logf("second run: SSD hits %d, restores %d (%d tokens), SSD %d bytes in %s", pc.Hits, pc.Restores, pc.RestoredTokens, pc.SSDBytes, pc.SSDDir)
}

package standalone_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// `macfleet serve` has the agent's GET /api/models/{id}/prefixes: a chat's prefix
// digests are reported held once its state is saved.
func TestServeRelaysPrefixEvents(t *testing.T) {
	runner := os.Getenv(runnerproc.RunnerEnv)
	if runner == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	hot := config.Size(64 << 20)
	cfg, err := config.Config{
		Runner: runner, RunnerThreads: 1, MemoryCeiling: 2 << 30, Listen: "127.0.0.1:0", PromptCacheHotBytes: &hot,
		Models: []config.Model{{Name: "m", Path: tinyModel(t), Settings: engine.Settings{ContextLength: 2048}, Residency: config.ResidencyResident}},
	}.Complete()
	if err != nil {
		t.Fatal(err)
	}
	s := serve(t, cfg)
	get := func(query string) runnerapi.PrefixEvents {
		t.Helper()
		resp, err := http.Get(s.base + "/api/models/m/prefixes?" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out runnerapi.PrefixEvents
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET prefixes?%s: %d %v", query, resp.StatusCode, err)
		}
		return out
	}
	waitFor(t, "the resident model's runner", func() bool { return s.model("m").State == enginepool.StateReady })
	first := get("")
	if !first.Reset || first.Epoch == "" {
		t.Fatalf("first listing: %+v", first)
	}
	const digest = "0123456789abcdef"
	body := `{"model":"m","max_tokens":2,"temperature":0,"messages":[{"role":"user","content":"` +
		strings.Repeat("Once upon a time a small model told a long story about caches. ", 10) + `"}]}`
	req, _ := http.NewRequest(http.MethodPost, s.base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(runnerapi.HeaderPrefixDigests, digest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: %d", resp.StatusCode)
	}
	got := get(fmt.Sprintf("epoch=%s&after=%d&wait=10", first.Epoch, first.Seq))
	if len(got.Events) != 1 || got.Events[0].Digest != digest || got.Events[0].Tier != runnerapi.TierHot {
		t.Fatalf("after the chat: %+v", got)
	}
}

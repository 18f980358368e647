package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// longChat is a chat request whose prompt spans several prompt cache blocks, so the
// runner saves its state after answering.
func longChat(model string, stream bool) map[string]any {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog while the cat watches. ", 12)
	b := map[string]any{"model": model, "max_tokens": 4, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": text}}}
	if stream {
		b["stream"] = true
	}
	return b
}

// runnerOf is the runner of model's current engine, asked without a lease (it may be
// draining).
func (a *testAgent) runnerOf(model string) enginepool.Runner {
	a.t.Helper()
	pid := a.pool.Snapshot().Models
	for _, m := range pid {
		if m.Name == model && m.PID > 0 {
			if r := a.factory.runner(m.PID); r != nil {
				return r
			}
		}
	}
	a.t.Fatalf("%s has no runner", model)
	return nil
}

func (a *testAgent) promptCacheOf(model string) runnerapi.PromptCacheStatus {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := a.runnerOf(model).Status(ctx)
	if err != nil || st.PromptCache == nil {
		a.t.Fatalf("%s's runner status: %v (prompt cache %v)", model, err, st.PromptCache)
	}
	return *st.PromptCache
}

func (a *testAgent) chat(body map[string]any) {
	a.t.Helper()
	if resp, b := a.do(http.MethodPost, "/v1/chat/completions", body); resp.StatusCode != http.StatusOK {
		a.t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
}

// The agent's hot budget is shared by the loaded runners and moves when models load
// and unload: what each runner was told is read from its own /status.
func TestPromptCacheHotBudgetSharedByRealRunners(t *testing.T) {
	const budget = 64 << 20
	a := startAgent(t, agentOptions{pool: enginepool.Config{PromptCacheHotBytes: budget}, specs: []enginepool.ModelSpec{
		tinySpec(t, config.Model{Name: "a", Settings: engine.Settings{ContextLength: 1024}}),
		tinySpec(t, config.Model{Name: "b", Settings: engine.Settings{ContextLength: 1024}}),
		tinySpec(t, config.Model{Name: "capped", Settings: engine.Settings{ContextLength: 1024},
			PromptCache: &config.PromptCache{HotBytes: ptr(config.Size(8 << 20))}}),
		tinySpec(t, config.Model{Name: "off", Settings: engine.Settings{ContextLength: 1024},
			PromptCache: &config.PromptCache{Enabled: ptr(false)}}),
	}})
	budgets := func(want map[string]int64) {
		t.Helper()
		got := map[string]int64{}
		eventually(t, 20*time.Second, "the runners' hot budgets", func() bool {
			for m := range want {
				got[m] = a.promptCacheOf(m).Hot.BudgetBytes
			}
			for m, w := range want {
				if got[m] != w {
					return false
				}
			}
			return true
		})
	}
	load := func(m string) {
		t.Helper()
		if resp, b := a.do(http.MethodPost, "/api/models/"+m+"/load", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("load %s: %d %s", m, resp.StatusCode, b)
		}
	}
	load("a")
	budgets(map[string]int64{"a": budget})
	load("off")
	load("b")
	budgets(map[string]int64{"a": budget / 2, "b": budget / 2, "off": 0})
	load("capped")
	budgets(map[string]int64{"a": (budget - 8<<20) / 2, "b": (budget - 8<<20) / 2, "capped": 8 << 20, "off": 0})
	if resp, b := a.do(http.MethodPost, "/api/models/b/unload?wait=true", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("unload b: %d %s", resp.StatusCode, b)
	}
	budgets(map[string]int64{"a": budget - 8<<20, "capped": 8 << 20, "off": 0})

	// The share and the runner's counters are in /api/status and /metrics.
	a.chat(longChat("a", false))
	eventually(t, 20*time.Second, "a's hot tier in /api/status", func() bool {
		pc := a.model("a").PromptCache
		return pc != nil && pc.HotShareBytes == budget-8<<20 && pc.HotBudgetBytes == budget-8<<20 && pc.HotEntries > 0
	})
	if m := a.model("off"); m.PromptCache != nil {
		t.Errorf("a model without the cache reports %+v", m.PromptCache)
	}
	a.expectMetric(float64(budget-8<<20), enginepool.MetricPromptCacheBudget, "model", "a")
	if v, ok := a.metric(enginepool.MetricPromptCacheHot, "model", "a"); !ok || v <= 0 {
		t.Errorf("%s{model=a} = %v, %v; want the hot tier's bytes", enginepool.MetricPromptCacheHot, v, ok)
	}
	if _, ok := a.metric(enginepool.MetricPromptCachePrefix+"saves_total", "model", "a"); !ok {
		t.Errorf("no saves counter for a")
	}
}

// Under hard pressure the enforcer takes every hot tier to zero: the runner frees
// its hot bytes; once pressure is over the share comes back.
func TestPromptCacheHardPressureFreesTheHotTier(t *testing.T) {
	const budget = 32 << 20
	a := startAgent(t, agentOptions{pool: enginepool.Config{PromptCacheHotBytes: budget}, specs: []enginepool.ModelSpec{
		tinySpec(t, config.Model{Name: "p", Settings: engine.Settings{ContextLength: 1024}, Residency: config.ResidencyPinned}),
	}})
	a.chat(longChat("p", false))
	eventually(t, 20*time.Second, "p's hot tier to hold a state", func() bool {
		pc := a.promptCacheOf("p")
		return pc.Hot.BudgetBytes == budget && pc.Hot.Bytes > 0
	})
	// A ceiling just above the usage: hard pressure (pinned: nothing to evict).
	used := a.pool.Snapshot().UsageBytes
	a.pool.SetConfiguredCeiling(used + used/50)
	eventually(t, 20*time.Second, "the hot tier freed under pressure", func() bool {
		pc := a.promptCacheOf("p")
		return pc.Hot.BudgetBytes == 0 && pc.Hot.Bytes == 0 && pc.Hot.Entries == 0
	})
	if lvl := a.pool.Snapshot().Pressure; lvl.Rank() < enginepool.PressureHard.Rank() {
		t.Logf("pressure is %s now", lvl)
	}
	a.pool.SetConfiguredCeiling(4 << 30)
	eventually(t, 20*time.Second, "the share back once pressure is over", func() bool {
		return a.promptCacheOf("p").Hot.BudgetBytes == budget
	})
	if st := a.model("p").State; st != enginepool.StateReady {
		t.Fatalf("p is %s, want it still loaded", st)
	}
}

// POST /api/cache/clear empties every hot tier, including the runner of a model being
// unloaded, and reports the entries dropped and the bytes the footprints gave back.
func TestCacheClearReachesARunnerBeingUnloaded(t *testing.T) {
	a := startAgent(t, agentOptions{pool: enginepool.Config{PromptCacheHotBytes: 64 << 20}, specs: []enginepool.ModelSpec{
		tinySpec(t, config.Model{Name: "going", Settings: engine.Settings{ContextLength: 1024, Parallel: 2}}),
		tinySpec(t, config.Model{Name: "staying", Settings: engine.Settings{ContextLength: 1024}}),
	}})
	for _, m := range []string{"going", "staying"} {
		a.chat(longChat(m, false))
		eventually(t, 20*time.Second, m+"'s hot tier to hold a state", func() bool { return a.promptCacheOf(m).Hot.Entries > 0 })
	}
	// A stream held open keeps "going" draining once its unload starts.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := a.openStream(ctx, true, "/v1/chat/completions", chatBody("going", 64, true))
	if _, err := st.next(); err != nil {
		t.Fatal(err)
	}
	if resp, b := a.do(http.MethodPost, "/api/models/going/unload", nil); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("unload: %d %s; want 202 while it drains", resp.StatusCode, b)
	}
	if s := a.model("going").State; s != enginepool.StateDraining {
		t.Fatalf("going is %s, want Draining", s)
	}
	goingHot := a.promptCacheOf("going").Hot.Entries

	resp, b := a.do(http.MethodPost, "/api/cache/clear", nil)
	var out server.CacheClearResponse
	if err := json.Unmarshal(b, &out); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("cache clear: %d %s", resp.StatusCode, b)
	}
	byModel := map[string]enginepool.RunnerCacheClear{}
	for _, r := range out.Runners {
		byModel[r.Model] = r
	}
	g, ok := byModel["going"]
	if !ok || g.Error != "" || g.EntriesCleared < goingHot {
		t.Fatalf("clear %s: the draining runner %+v, want it reached with its %d hot entries cleared", b, g, goingHot)
	}
	if s, ok := byModel["staying"]; !ok || s.Error != "" || s.EntriesCleared < 1 {
		t.Fatalf("clear %s: staying %+v", b, s)
	}
	if out.EntriesCleared < goingHot+1 || out.BytesReclaimed < 0 {
		t.Fatalf("clear %s: entries %d bytes %d", b, out.EntriesCleared, out.BytesReclaimed)
	}
	// (The held stream's own state may be saved once its generation ends: the hot
	// tier is not checked empty afterwards.)
	a.release()
	cancel()
	eventually(t, 30*time.Second, "going to unload", func() bool { return a.model("going").State == enginepool.StateUnloaded })
}

func ptr[T any](v T) *T { return &v }

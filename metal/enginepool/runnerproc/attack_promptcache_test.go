package runnerproc

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// ssdStats is the runner's prompt cache report (its /status).
func ssdStats(t *testing.T, r enginepool.Runner) *runnerapi.PromptCacheStatus {
	t.Helper()
	var st enginepool.RunnerStatus
	procGetJSON(t, r, "/status", &st)
	if st.PromptCache == nil || st.PromptCache.SSD == nil {
		t.Fatalf("the runner reports no prompt cache with an SSD tier: %+v", st.PromptCache)
	}
	return st.PromptCache
}

// TestAttackPromptCacheOfAnotherTenant: team B runs the same model file as team A on
// the same Mac, after team A's runner saved a long prompt to the SSD tier and went
// away, and sends that prompt to restore team A's state (and learn, by the timing,
// what team A asked); B's runner must find nothing of A's, while A's next runner
// still restores it.
func TestAttackPromptCacheOfAnotherTenant(t *testing.T) {
	env := newAdoptEnv(t)
	pcDir := t.TempDir()
	// A fresh factory per runner: the directory of a stopped runner is free again, as
	// it is for the next runner an agent starts.
	factory := func() *ProcessFactory {
		return env.factory(func(c *ProcessConfig) { c.PromptCacheDir, c.PromptCacheSSDBytes = pcDir, 1<<30 })
	}
	spec := func(ns string) enginepool.ModelSpec {
		s := env.spec()
		s.Name, s.Namespace, s.PromptCache = "tiny-"+ns, ns, enginepool.PromptCacheSpec{Enabled: true}
		return s
	}
	secret := strings.Repeat("Team A's confidential merger memo, paragraph after paragraph. ", 6)
	body, _ := json.Marshal(map[string]any{"prompt": secret, "max_tokens": 1, "temperature": 0})

	run := func(ns string, wantSaved bool) *runnerapi.PromptCacheStatus {
		t.Helper()
		r := adoptStart(t, factory(), spec(ns))
		procPost(t, r, string(body))
		var st *runnerapi.PromptCacheStatus
		deadline := time.Now().Add(30 * time.Second)
		for st = ssdStats(t, r); wantSaved && st.SSD.SavesPersisted < 1; st = ssdStats(t, r) {
			if time.Now().After(deadline) {
				t.Fatalf("%s's runner did not persist its prompt: %+v", ns, st)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := r.Stop(t.Context(), 5*time.Second); err != nil {
			t.Fatal(err)
		}
		return st
	}

	a := run("team-a", true)
	if a.Restores != 0 {
		t.Fatalf("team A's first runner restored %d states from an empty cache", a.Restores)
	}
	b := run("team-b", false)
	if b.SSD.Hits != 0 || b.Restores != 0 || b.RestoredTokens != 0 {
		t.Errorf("team B's runner restored team A's prompt: %d SSD hits, %d restores (%d tokens) from %s",
			b.SSD.Hits, b.Restores, b.RestoredTokens, b.Dir)
	}
	if b.Dir == a.Dir {
		t.Errorf("teams A and B share the SSD directory %s", a.Dir)
	}
	// The control: the cache works, for its own tenant.
	if again := run("team-a", false); again.Restores < 1 || again.RestoredTokens < 64 {
		t.Errorf("team A's next runner did not restore its own prompt: %+v", again)
	}
}

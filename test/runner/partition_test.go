package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// chatIn sends a greedy chat of prompt in a prompt cache partition (the gateway's
// header, "" for none) with salt as cache_salt ("" for none) and returns its usage.
func chatIn(t *testing.T, r *runner, partition, salt, prompt string) runnerapi.Usage {
	t.Helper()
	body := map[string]any{"model": "test", "temperature": 0, "max_tokens": 4,
		"messages": []chatMsg{{"role": "user", "content": prompt}}}
	if salt != "" {
		body["cache_salt"] = salt
	}
	var headers map[string]string
	if partition != "" {
		headers = map[string]string{runnerapi.HeaderCachePartition: partition}
	}
	return *chatRequest(t, r, body, headers).Usage
}

// chatRequest sends a chat request body with headers and returns the answer, which
// must be one with usage.
func chatRequest(t testing.TB, r *runner, body map[string]any, headers map[string]string) runnerapi.ChatCompletion {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, r.base+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	var c runnerapi.ChatCompletion
	if resp.StatusCode != http.StatusOK || json.Unmarshal(out, &c) != nil || c.Usage == nil {
		t.Fatalf("chat with %v: %d %s", headers, resp.StatusCode, out)
	}
	return c
}

// TestPromptCachePartitions: a prefix computed in one partition (team A) is never a
// hit for another (team B, or team A's requests with a cache_salt): not from the
// slot's own KV (one slot, so B's request lands where A's prompt is), not from the
// hot tier, not from the SSD tier. The same partition still hits each time, so every
// zero below is the partition's doing.
func TestPromptCachePartitions(t *testing.T) {
	r := startReady(t, model(t, "tiny"), "--parallel", "1", "--prompt-cache-block", "32",
		"--prompt-cache-hot-bytes", fmt.Sprint(1<<30), "--prompt-cache-dir", t.TempDir())
	prompt := words(41, 300)
	type step struct {
		name, partition, salt string
		hit                   bool
	}
	run := func(steps ...step) {
		t.Helper()
		for _, s := range steps {
			u := chatIn(t, r, s.partition, s.salt, prompt)
			if got := cachedTokens(u); (got > 0) != s.hit {
				t.Errorf("%s: cached_tokens %d of %d; want a hit: %v", s.name, got, u.PromptTokens, s.hit)
			}
		}
	}
	run(
		step{"team A, first", "team-a", "", false},
		// The slot holds team A's prompt, the hot tier its state.
		step{"team B after team A (slot and hot tier)", "team-b", "", false},
		step{"the shared partition after team A", "", "", false},
		// The slot now holds the shared partition's tokens: team A hits its hot state.
		step{"team A again (hot tier)", "team-a", "", true},
		step{"team A with a cache_salt", "team-a", "s1", false},
		step{"team A with the same cache_salt", "team-a", "s1", true},
		step{"team A with another cache_salt", "team-a", "s2", false},
	)

	// Only the SSD tier left: the hot tier emptied once every state is on disk.
	deadline := time.Now().Add(30 * time.Second)
	for pc := promptCacheStatus(t, r); pc.SavesPending > 0 || pc.SSD == nil || pc.SSD.SavesPersisted < 3; pc = promptCacheStatus(t, r) {
		if time.Now().After(deadline) {
			t.Fatalf("the SSD tier did not persist the states: %+v", pc)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var res runnerapi.CacheBudgetResult
	if code := r.postJSON("/cache/budget", map[string]any{"hot_bytes": 0}, &res); code != http.StatusOK || res.EvictedEntries == 0 {
		t.Fatalf("emptying the hot tier: %d %+v", code, res)
	}
	before := promptCacheStatus(t, r).SSD.Hits
	run(
		// Team C never sent the prompt (team B did, and hits its own state).
		step{"team C (SSD)", "team-c", "", false},
		step{"team B (SSD)", "team-b", "", true},
		step{"team A (SSD)", "team-a", "", true},
	)
	if hits := promptCacheStatus(t, r).SSD.Hits - before; hits != 2 {
		t.Errorf("the SSD tier answered %d lookups, want team B's and team A's alone", hits)
	}
}

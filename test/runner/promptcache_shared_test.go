package e2e

import (
	"fmt"
	"io/fs"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// TestPromptCacheSharedDirectory: two runners of one model on one SSD directory, as
// the agent starts two replicas of a model of one namespace on one Mac. The second
// restores from the SSD what the first saved, and its answer is exactly a full
// prefill's (greedy). Then, with their hot tiers off and a quota of about two states,
// both answer conversations at once, restoring and evicting each other's files:
// every answer is still a full prefill's, no file is corrupt, no restore fails, and
// the directory stays within the quota (plus a state being written by the other).
func TestPromptCacheSharedDirectory(t *testing.T) {
	m := model(t, "small")
	conv := &conversation{users: []string{words(1, 260), words(2, 140)}}
	const singles = 4
	single := func(k int) []chatMsg { return []chatMsg{{"role": "user", "content": words(uint64(40+k), 180)}} }

	// Full-prefill answers, from a runner without a prompt cache.
	base := startReady(t, m)
	for turn := range conv.users {
		clearCache(t, base)
		reply, _ := chatTurn(t, base, conv.messages(turn), pcMaxTokens)
		conv.replies = append(conv.replies, reply)
	}
	want := make([][]runnerapi.TokenLogprob, singles)
	for k := range want {
		clearCache(t, base)
		want[k] = greedyTurn(t, base, single(k), pcMaxTokens)
	}
	p1 := tokenCount(t, base, conv.messages(0))
	base.stop()

	dir := t.TempDir()
	flags := []string{"--prompt-cache-block", fmt.Sprint(pcBlock), "--prompt-cache-hot-bytes", fmt.Sprint(1 << 30),
		"--prompt-cache-dir", dir}
	a, b := startReady(t, m, flags...), startReady(t, m, flags...)
	if da, db := promptCacheStatus(t, a).Dir, promptCacheStatus(t, b).Dir; da != db || da == "" {
		t.Fatalf("the runners' SSD directories %q and %q, want one", da, db)
	}

	// A answers the first turn and saves its state; B restores it for the second.
	if reply, _ := chatTurn(t, a, conv.messages(0), pcMaxTokens); reply != conv.replies[0] {
		t.Fatalf("A's first turn %q, full prefill %q", reply, conv.replies[0])
	}
	state := waitPersisted(t, a)
	reply, u := chatTurn(t, b, conv.messages(1), pcMaxTokens)
	if reply != conv.replies[1] {
		t.Errorf("B's second turn %q, full prefill %q", reply, conv.replies[1])
	}
	if got := cachedTokens(u); got < p1-8 || got >= u.PromptTokens {
		t.Errorf("B restored %d of %d prompt tokens, want at least %d (A's first turn)", got, u.PromptTokens, p1-8)
	}
	if pc := promptCacheStatus(t, b); pc.Restores != 1 || pc.SSD.Hits == 0 || pc.RestoreFailures != 0 {
		t.Errorf("B after restoring A's state: restores %d, failures %d, SSD %+v", pc.Restores, pc.RestoreFailures, pc.SSD)
	}

	// Both at once, the hot tiers off, a quota of two and a half of A's first state.
	quota := state * 5 / 2
	for _, r := range []*runner{a, b} {
		var res runnerapi.CacheBudgetResult
		if code := r.postJSON("/cache/budget", map[string]any{"hot_bytes": 0, "ssd_bytes": quota}, &res); code != http.StatusOK {
			t.Fatalf("budget: %d", code)
		}
	}
	t.Run("concurrent", func(t *testing.T) {
		for i, r := range []*runner{a, b} {
			t.Run(fmt.Sprintf("runner-%d", i), func(t *testing.T) {
				t.Parallel()
				for j := range 8 {
					k := (j + i*2 + j/singles) % singles
					if d := departureWithin(want[k], greedyTurn(t, r, single(k), pcMaxTokens), restoreTolerance()); d != "" {
						t.Errorf("request %d (conversation %d) after a restore %s", j, k, d)
					}
				}
			})
		}
	})
	hits, evictions := int64(0), int64(0)
	for i, r := range []*runner{a, b} {
		pc := promptCacheStatus(t, r)
		t.Logf("runner %d: restores %d, SSD %+v", i, pc.Restores, *pc.SSD)
		if pc.RestoreFailures != 0 || pc.SSD.Corrupt != 0 || pc.SSD.Errors != 0 {
			t.Errorf("runner %d: %d failed restores, %d corrupt files, %d write errors", i, pc.RestoreFailures, pc.SSD.Corrupt, pc.SSD.Errors)
		}
		hits += pc.SSD.Hits
		evictions += pc.SSD.Evictions
	}
	if hits < 2 || evictions == 0 {
		t.Errorf("%d SSD hits and %d evictions: the runners did not share the directory under its quota", hits, evictions)
	}
	waitPersisted(t, a)
	waitPersisted(t, b)
	if used := dirBytes(t, dir); used > quota+state {
		t.Errorf("the directory holds %d bytes, over its quota of %d and a state being written (%d)", used, quota, state)
	}
}

// greedyTurn is chatTurn with the answer's tokens and their two best alternatives.
func greedyTurn(t *testing.T, r *runner, msgs []chatMsg, maxTokens int) []runnerapi.TokenLogprob {
	t.Helper()
	var out struct {
		Choices []struct {
			Logprobs runnerapi.ChatLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	body := map[string]any{"model": "test", "messages": msgs, "temperature": 0, "max_tokens": maxTokens,
		"logprobs": true, "top_logprobs": 2}
	if code := r.postJSON("/v1/chat/completions", body, &out); code != http.StatusOK || len(out.Choices) != 1 {
		t.Fatalf("greedy turn: status %d, %+v", code, out)
	}
	return out.Choices[0].Logprobs.Content
}

// restoreTolerance is how close the full prefill's two best tokens may be for an
// answer after a restored prefix to take the other. On the CPU none: a restored
// prefix and a prefill of it give the same logits there. On a GPU the prefill's
// batches and the restored tail's go through different kernels (quantized products
// against cuBLAS), which moves a logit by a few hundredths, as between the GPU and the
// CPU (gpuTolerance).
func restoreTolerance() float64 {
	if gpuSuite() {
		return gpuTolerance
	}
	return 0
}

// waitPersisted waits until r's SSD tier has written every save it accepted and
// returns its bytes.
func waitPersisted(t *testing.T, r *runner) int64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ssd := promptCacheStatus(t, r).SSD
		if ssd == nil {
			t.Fatal("no SSD tier")
		}
		if ssd.Queued == 0 && ssd.Saves > 0 &&
			ssd.Saves == ssd.SavesPersisted+ssd.Duplicates+ssd.QuotaRejects+ssd.Cancelled+ssd.Errors {
			return ssd.Bytes
		}
		if time.Now().After(deadline) {
			t.Fatalf("the SSD tier did not settle: %+v", *ssd)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dirBytes sums the state files under dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".kvc") {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// words returns n pseudo-random words (deterministic per seed).
func words(seed uint64, n int) string {
	vocab := strings.Fields("the a river stone light over under quick slow green blue market seven " +
		"winter summer paper glass north south engine little garden window silver thread morning " +
		"evening copper harbor yellow bridge forest number letter ocean castle mirror pocket")
	rng := rand.New(rand.NewPCG(seed, 42))
	out := make([]string, n)
	for i := range out {
		out[i] = vocab[rng.IntN(len(vocab))]
	}
	return strings.Join(out, " ")
}

type chatMsg = map[string]string

// chatTurn sends a greedy chat of msgs and returns the reply and usage.
func chatTurn(t *testing.T, r *runner, msgs []chatMsg, maxTokens int) (string, runnerapi.Usage) {
	t.Helper()
	c := chatWhole(t, r, map[string]any{"model": "test", "messages": msgs, "temperature": 0, "max_tokens": maxTokens})
	if len(c.Choices) != 1 || c.Usage == nil {
		t.Fatalf("chat answer without one choice and usage: %+v", c)
	}
	return c.Choices[0].Message.Text(), *c.Usage
}

func cachedTokens(u runnerapi.Usage) int {
	if u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

func promptCacheStatus(t *testing.T, r *runner) runnerapi.PromptCacheStatus {
	t.Helper()
	st := r.status()
	if st.PromptCache == nil {
		t.Fatalf("/status has no prompt_cache: %+v", st)
	}
	return *st.PromptCache
}

func clearCache(t testing.TB, r *runner) runnerapi.CacheClear {
	t.Helper()
	var cc runnerapi.CacheClear
	if code := r.postJSON("/cache/clear", nil, &cc); code != http.StatusOK {
		t.Fatalf("cache clear: %d", code)
	}
	return cc
}

func tokenCount(t *testing.T, r *runner, msgs []chatMsg) int {
	t.Helper()
	var tr runnerapi.TokenizeResponse
	if code := r.postJSON("/tokenize", map[string]any{"messages": msgs}, &tr); code != http.StatusOK {
		t.Fatalf("tokenize: %d", code)
	}
	return tr.Count
}

// conversation is a three-turn chat whose user messages are long enough to span many
// blocks.
type conversation struct {
	users   []string
	replies []string // filled by the full-prefill baseline
}

func (c *conversation) messages(turn int) []chatMsg {
	var msgs []chatMsg
	for i := 0; i <= turn; i++ {
		msgs = append(msgs, chatMsg{"role": "user", "content": c.users[i]})
		if i < turn {
			msgs = append(msgs, chatMsg{"role": "assistant", "content": c.replies[i]})
		}
	}
	return msgs
}

const (
	pcBlock     = 32
	pcMaxTokens = 24
)

// TestPromptCacheRestoreMatchesFullPrefill proves that a state restored from the hot
// tier, from the SSD tier after a hot clear, and from the SSD tier of a restarted
// runner produces exactly the tokens a full prefill does (greedy), that the longest
// prefix wins across tiers, and that corrupt or truncated files are misses.
func TestPromptCacheRestoreMatchesFullPrefill(t *testing.T) {
	m := model(t, "small")
	conv := &conversation{users: []string{words(1, 260), words(2, 140), words(3, 120)}}

	// Baseline: a runner without a prompt cache, its slot cleared before every turn so
	// each prompt is prefilled in full.
	base := startReady(t, m)
	for turn := range conv.users {
		clearCache(t, base)
		reply, u := chatTurn(t, base, conv.messages(turn), pcMaxTokens)
		if cachedTokens(u) != 0 || u.CompletionTokens == 0 {
			t.Fatalf("baseline turn %d: %d cached tokens, %d completion tokens", turn, cachedTokens(u), u.CompletionTokens)
		}
		conv.replies = append(conv.replies, reply)
	}
	p1 := tokenCount(t, base, conv.messages(0))
	p2 := tokenCount(t, base, conv.messages(1))
	base.stop()
	t.Logf("prompt tokens: turn 1 %d, turn 2 %d; replies %q", p1, p2, conv.replies)

	dir := t.TempDir()
	flags := []string{"--prompt-cache-block", fmt.Sprint(pcBlock), "--prompt-cache-hot-bytes", fmt.Sprint(1 << 30),
		"--prompt-cache-dir", dir}
	check := func(t *testing.T, r *runner, turn int, what string) runnerapi.Usage {
		t.Helper()
		reply, u := chatTurn(t, r, conv.messages(turn), pcMaxTokens)
		if reply != conv.replies[turn] {
			t.Errorf("%s: turn %d reply %q, full prefill gave %q", what, turn, reply, conv.replies[turn])
		}
		return u
	}
	// A restore must cover every token the previous turn's state shares with the
	// prompt: at least the previous prompt but its last few tokens (the generation
	// prefix, which the next turn may tokenize with the reply), not only up to a block
	// boundary, and never the whole prompt.
	wantRestored := func(t *testing.T, u runnerapi.Usage, prevPrompt int, what string) {
		t.Helper()
		got := cachedTokens(u)
		least := prevPrompt - 8
		if got < least || got >= u.PromptTokens {
			t.Errorf("%s: %d cached tokens of %d, want at least %d", what, got, u.PromptTokens, least)
		}
	}

	a := startReady(t, m, flags...)
	if pc := promptCacheStatus(t, a); pc.BlockTokens != pcBlock || pc.Hot.BudgetBytes != 1<<30 || pc.SSD == nil || pc.Dir == "" {
		t.Fatalf("prompt cache status: %+v", pc)
	}
	check(t, a, 0, "first turn")
	if pc := promptCacheStatus(t, a); pc.StatesSaved != 1 || pc.Hot.Entries == 0 || pc.Restores != 0 {
		t.Fatalf("after the first turn: %+v", pc)
	}
	// Another conversation takes the only slot, so the next turn cannot reuse it.
	chatTurn(t, a, []chatMsg{{"role": "user", "content": words(99, 40)}}, 4)

	t.Run("hot", func(t *testing.T) {
		before := promptCacheStatus(t, a)
		u := check(t, a, 1, "hot hit")
		wantRestored(t, u, p1, "hot hit")
		after := promptCacheStatus(t, a)
		if after.Restores != before.Restores+1 || after.Hot.Hits <= before.Hot.Hits {
			t.Errorf("hot hit not counted: before %+v after %+v", before, after)
		}
	})
	t.Run("ssd-after-hot-clear", func(t *testing.T) {
		cc := clearCache(t, a)
		if cc.HotEntriesCleared < 2 || cc.HotBytesCleared <= 0 || cc.EntriesCleared < cc.HotEntriesCleared+1 {
			t.Errorf("cache clear: %+v", cc)
		}
		before := promptCacheStatus(t, a)
		if before.Hot.Entries != 0 || before.Hot.Bytes != 0 {
			t.Fatalf("hot tier not empty after a clear: %+v", before.Hot)
		}
		u := check(t, a, 1, "SSD hit")
		wantRestored(t, u, p1, "SSD hit")
		after := promptCacheStatus(t, a)
		if after.Restores != before.Restores+1 || after.SSD.Hits <= before.SSD.Hits {
			t.Errorf("SSD hit not counted: before %+v after %+v", before.SSD, after.SSD)
		}
	})
	a.stop()

	b := startReady(t, m, flags...)
	t.Run("ssd-after-restart", func(t *testing.T) {
		if pc := promptCacheStatus(t, b); pc.SSD.Entries == 0 || pc.Hot.Entries != 0 {
			t.Fatalf("restarted runner's cache: %+v", pc)
		}
		u := check(t, b, 1, "SSD hit after a restart")
		wantRestored(t, u, p1, "SSD hit after a restart")
		if pc := promptCacheStatus(t, b); pc.Restores != 1 || pc.SSD.Hits == 0 || pc.RestoreFailures != 0 {
			t.Errorf("after the SSD hit: %+v", pc)
		}
	})
	t.Run("longest-prefix-across-tiers", func(t *testing.T) {
		// The hot tier gets the first turn's state back (an SSD hit promotes it), the
		// SSD keeps the deeper second turn's: the third turn must restore the deeper.
		clearCache(t, b)
		check(t, b, 0, "first turn again")
		if pc := promptCacheStatus(t, b); pc.Hot.Entries == 0 {
			t.Fatalf("nothing promoted to the hot tier: %+v", pc.Hot)
		}
		before := promptCacheStatus(t, b)
		u := check(t, b, 2, "third turn")
		wantRestored(t, u, p2, "third turn")
		if got := cachedTokens(u); got <= p1+pcMaxTokens {
			t.Errorf("third turn restored %d tokens: no deeper than the first turn's state (%d prompt + %d generated)",
				got, p1, pcMaxTokens)
		}
		after := promptCacheStatus(t, b)
		if after.SSD.Hits <= before.SSD.Hits || after.Restores != before.Restores+1 {
			t.Errorf("the deeper SSD state was not the one restored: before %+v after %+v", before, after)
		}
	})
	b.stop()

	t.Run("corrupt-and-truncated-files-are-misses", func(t *testing.T) {
		var files []string
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".kvc") {
				files = append(files, p)
			}
			return nil
		})
		if len(files) < 4 {
			t.Fatalf("want at least 4 cache files, found %v", files)
		}
		for i, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if i%2 == 0 {
				b[len(b)-1] ^= 0xff // payload damaged: found on read
			} else {
				b = b[:len(b)-len(b)/3] // truncated: found on open
			}
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		c := startReady(t, m, flags...)
		check(t, c, 1, "after corruption")
		check(t, c, 2, "after corruption")
		// Every file is bad: the second turn is prefilled in full, and the third extends
		// it in the slot.
		pc := promptCacheStatus(t, c)
		if pc.Restores != 0 || pc.RestoreFailures != 0 || pc.SSD.Corrupt == 0 || pc.SSD.Hits != 0 {
			t.Errorf("after corruption: restores %d, ssd %+v", pc.Restores, pc.SSD)
		}
	})
	t.Run("restore-into-another-slot", func(t *testing.T) {
		// Two slots: the first turn runs in slot 0; after a clear both are empty and the
		// least recently used one (slot 1) takes the restored state.
		d := startReady(t, m, "--parallel", "2", "--prompt-cache-block", fmt.Sprint(pcBlock),
			"--prompt-cache-hot-bytes", fmt.Sprint(1<<30), "--prompt-cache-dir", t.TempDir())
		check(t, d, 0, "two slots, first turn")
		clearCache(t, d)
		u := check(t, d, 1, "two slots, restored into the other slot")
		wantRestored(t, u, p1, "two slots")
		if pc := promptCacheStatus(t, d); pc.Restores != 1 || pc.RestoreFailures != 0 {
			t.Errorf("two slots: %+v", pc)
		}
	})
}

// TestPromptCacheBudgetAndClear covers POST /cache/budget and the hot tier's part of
// POST /cache/clear, and that a runner without cache flags saves nothing.
func TestPromptCacheBudgetAndClear(t *testing.T) {
	m := model(t, "tiny")
	plain := startReady(t, m)
	chatTurn(t, plain, []chatMsg{{"role": "user", "content": words(5, 200)}}, 8)
	if pc := promptCacheStatus(t, plain); pc.StatesSaved != 0 || pc.Hot.Puts != 0 || pc.SSD != nil || pc.Hot.BudgetBytes != 0 {
		t.Errorf("a runner without cache flags used the cache: %+v", pc)
	}
	// A budget handed out at runtime turns the hot tier on.
	var res runnerapi.CacheBudgetResult
	if code := plain.postJSON("/cache/budget", map[string]any{"hot_bytes": 64 << 20}, &res); code != http.StatusOK || res.HotBytes != 64<<20 {
		t.Fatalf("budget: %d %+v", code, res)
	}
	chatTurn(t, plain, []chatMsg{{"role": "user", "content": words(6, 200)}}, 8)
	pc := promptCacheStatus(t, plain)
	if pc.StatesSaved != 1 || pc.Hot.Entries == 0 || pc.Hot.Bytes <= 0 {
		t.Fatalf("after a budget: %+v", pc)
	}
	// Shrinking the budget evicts.
	if code := plain.postJSON("/cache/budget", map[string]any{"hot_bytes": 0}, &res); code != http.StatusOK ||
		res.HotBytes != 0 || res.EvictedEntries != pc.Hot.Entries || res.EvictedBytes != pc.Hot.Bytes {
		t.Errorf("budget 0: %d %+v, hot tier held %+v", code, res, pc.Hot)
	}
	var eb runnerapi.ErrorBody
	if code := plain.postJSON("/cache/budget", map[string]any{"hot_bytes": -1}, &eb); code != http.StatusBadRequest ||
		eb.Error.Param == nil || *eb.Error.Param != "hot_bytes" {
		t.Errorf("negative budget: %d %+v", code, eb)
	}
	if code := plain.postJSON("/cache/budget", `{"hot_bytes":`, &eb); code != http.StatusBadRequest {
		t.Errorf("malformed budget: %d", code)
	}
}

// TestPromptCacheClearReclaimsFootprint checks that clearing a hot tier holding tens of
// MB gives the memory back to the OS: bytes_reclaimed (the measured footprint drop)
// covers most of what the hot tier accounted.
func TestPromptCacheClearReclaimsFootprint(t *testing.T) {
	r := startReady(t, model(t, "small"), "--prompt-cache-hot-bytes", fmt.Sprint(1<<30))
	for i := range 6 {
		chatTurn(t, r, []chatMsg{{"role": "user", "content": words(uint64(100+i), 500)}}, 4)
	}
	pc := promptCacheStatus(t, r)
	if pc.Hot.Bytes < 12<<20 || pc.StatesSaved != 6 {
		t.Fatalf("hot tier after 6 long prompts: %+v (states saved %d)", pc.Hot, pc.StatesSaved)
	}
	cc := clearCache(t, r)
	if cc.HotBytesCleared != pc.Hot.Bytes || cc.HotEntriesCleared != pc.Hot.Entries {
		t.Errorf("clear %+v, hot tier held %+v", cc, pc.Hot)
	}
	if cc.BytesReclaimed < cc.HotBytesCleared/2 {
		t.Errorf("clearing %d hot bytes reclaimed only %d bytes of footprint", cc.HotBytesCleared, cc.BytesReclaimed)
	}
	t.Logf("hot tier %d bytes in %d entries; footprint drop %d bytes", cc.HotBytesCleared, cc.HotEntriesCleared, cc.BytesReclaimed)
}

// TestPromptCacheReadsRepliesAsGenerated proves that a second turn prefills only what
// follows the first turn's reply even when the reply's text re-tokenizes into other
// tokens than the model generated (a random-weight model with the real Llama 3
// vocabulary does that on most replies): the prompt continues the state's tokens as
// far as its text does.
func TestPromptCacheReadsRepliesAsGenerated(t *testing.T) {
	r := startReady(t, specModel(t, "llama31", testassets.Llama31Spec), "--prompt-cache-block", "32",
		"--prompt-cache-hot-bytes", fmt.Sprint(1<<30))
	const replyTokens = 40
	checked := 0
	for seed := uint64(1); seed <= 8 && checked < 2; seed++ {
		first := []chatMsg{{"role": "system", "content": "You answer in one sentence."},
			{"role": "user", "content": words(seed, 60)}}
		reply, u1 := chatTurn(t, r, first, replyTokens)
		second := append(append([]chatMsg(nil), first...), chatMsg{"role": "assistant", "content": reply},
			chatMsg{"role": "user", "content": words(seed+100, 12)})
		empty := append(append([]chatMsg(nil), second[:2]...), chatMsg{"role": "assistant", "content": ""}, second[3])
		// A reply whose text is not the generated text cannot be read as generated: the
		// template trims leading white space, and bytes that are not UTF-8 come back as
		// U+FFFD. The reply's usual tokens: the prompt with it less without it.
		reTokenized := tokenCount(t, r, second) - tokenCount(t, r, empty)
		if strings.TrimSpace(reply) != reply || strings.ContainsRune(reply, utf8.RuneError) ||
			u1.CompletionTokens != replyTokens || reTokenized == u1.CompletionTokens {
			t.Logf("seed %d: reply %q (%d tokens, %d re-tokenized): not one that re-tokenizes otherwise", seed, reply,
				u1.CompletionTokens, reTokenized)
			continue
		}
		checked++
		// Another conversation takes the only slot: the state comes from the hot tier.
		chatTurn(t, r, []chatMsg{{"role": "user", "content": words(seed+200, 8)}}, 2)
		before := promptCacheStatus(t, r)
		_, u2 := chatTurn(t, r, second, 4)
		after := promptCacheStatus(t, r)
		if after.Restores != before.Restores+1 {
			t.Fatalf("seed %d: the second turn restored nothing: %+v", seed, after)
		}
		// What follows the reply: end of turn, the user's message, the generation
		// prefix; plus the last generated token (never decoded, so not in the state)
		// and a token or two where its text joins what follows.
		after2 := tokenCount(t, r, empty) - u1.PromptTokens
		prefilled := u2.PromptTokens - cachedTokens(u2)
		t.Logf("seed %d: reply %q of %d tokens re-tokenizes into %d; second turn %d prompt tokens, %d prefilled (%d follow the reply)",
			seed, reply, u1.CompletionTokens, reTokenized, u2.PromptTokens, prefilled, after2)
		if prefilled > after2+3 || prefilled < 1 {
			t.Errorf("seed %d: %d tokens prefilled, want at most %d: the reply was prefilled again", seed, prefilled, after2+3)
		}
	}
	if checked < 2 {
		t.Fatalf("only %d of 8 replies re-tokenize into other tokens than generated: this test cannot tell", checked)
	}
}

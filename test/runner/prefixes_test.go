package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// chatWith sends a greedy chat of msgs with the given headers and returns the reply
// and usage.
func chatWith(t testing.TB, r *runner, headers map[string]string, msgs []chatMsg, maxTokens int) (string, runnerapi.Usage) {
	t.Helper()
	c := chatRequest(t, r, map[string]any{"model": "test", "temperature": 0, "max_tokens": maxTokens, "messages": msgs}, headers)
	if len(c.Choices) != 1 {
		t.Fatalf("chat with %v: %d choices", headers, len(c.Choices))
	}
	return c.Choices[0].Message.Text(), *c.Usage
}

// tokensOf tokenizes a chat the way the runner renders it.
func tokensOf(t *testing.T, r *runner, msgs []chatMsg) []int32 {
	t.Helper()
	var tr runnerapi.TokenizeResponse
	if code := r.postJSON("/tokenize", map[string]any{"messages": msgs}, &tr); code != http.StatusOK || len(tr.Tokens) == 0 {
		t.Fatalf("tokenize: %d %+v", code, tr)
	}
	return tr.Tokens
}

func sharedTokens(a, b []int32) int {
	n := 0
	for n < min(len(a), len(b)) && a[n] == b[n] {
		n++
	}
	return n
}

// TestPromptCacheSharedPrefix: two conversations that share a long system prompt and
// differ after it. The second restores the first's state trimmed to the shared
// blocks, from the hot tier and from the SSD tier of a restarted runner, and answers
// exactly what a cold runner does (greedy); another partition restores nothing.
func TestPromptCacheSharedPrefix(t *testing.T) {
	m := specModel(t, "llama31", testassets.Llama31Spec)
	const block = 32
	system := chatMsg{"role": "system", "content": "You are a careful assistant. " + words(7, 220)}
	conv := func(seed uint64) []chatMsg {
		return []chatMsg{system, {"role": "user", "content": "Tell me about the " + words(seed, 40)}}
	}
	a, b, c := conv(8), conv(9), conv(10)
	part := func(p string) map[string]string { return map[string]string{runnerapi.HeaderCachePartition: p} }

	cold := startReady(t, m)
	shared := sharedTokens(tokensOf(t, cold, a), tokensOf(t, cold, b))
	if shared/block < 4 {
		t.Fatalf("the conversations share %d tokens, under 4 blocks of %d", shared, block)
	}
	coldReply := map[string]string{}
	for name, msgs := range map[string][]chatMsg{"b": b, "c": c} {
		clearCache(t, cold)
		reply, u := chatWith(t, cold, nil, msgs, 16)
		if cachedTokens(u) != 0 {
			t.Fatalf("cold %s: %d cached tokens", name, cachedTokens(u))
		}
		coldReply[name] = reply
	}
	cold.stop()

	dir := t.TempDir()
	flags := []string{"--parallel", "1", "--prompt-cache-block", fmt.Sprint(block), "--prompt-cache-hot-bytes", fmt.Sprint(1 << 30),
		"--prompt-cache-dir", dir}
	r := startReady(t, m, flags...)
	// other takes the only slot, so that a restore (not the slot) serves the next one.
	other := func(r *runner) {
		chatWith(t, r, part("team-z"), []chatMsg{{"role": "user", "content": words(99, 30)}}, 2)
	}
	wantShared := func(what string, u runnerapi.Usage, reply, want string) {
		t.Helper()
		if got := cachedTokens(u); got < shared/block*block || got > shared {
			t.Errorf("%s: %d cached tokens, want the %d shared tokens' full blocks (%d) or more, at most %d",
				what, got, shared, shared/block*block, shared)
		}
		if reply != want {
			t.Errorf("%s: reply %q, a cold runner says %q", what, reply, want)
		}
	}

	chatWith(t, r, part("team-a"), a, 16)
	other(r)
	before := promptCacheStatus(t, r)
	reply, u := chatWith(t, r, part("team-a"), b, 16)
	wantShared("b after a (hot)", u, reply, coldReply["b"])
	if after := promptCacheStatus(t, r); after.Restores != before.Restores+1 {
		t.Errorf("b was not restored from the prompt cache: restores %d -> %d", before.Restores, after.Restores)
	}
	other(r)
	if _, u := chatWith(t, r, part("team-b"), c, 16); cachedTokens(u) != 0 {
		t.Errorf("another partition's c: %d cached tokens, want 0", cachedTokens(u))
	}
	waitFor(t, 30*time.Second, "the SSD tier to persist the states", func() bool {
		pc := promptCacheStatus(t, r)
		return pc.SavesPending == 0 && pc.SSD != nil && pc.SSD.Queued == 0
	})
	r.stop()

	r = startReady(t, m, flags...)
	reply, u = chatWith(t, r, part("team-a"), c, 16)
	wantShared("c after a restart (SSD)", u, reply, coldReply["c"])
	if pc := promptCacheStatus(t, r); pc.Restores != 1 || pc.SSD.Hits == 0 {
		t.Errorf("c was not restored from the SSD tier: %+v", pc)
	}
}

// prefixes long-polls /cache/prefixes.
func prefixes(t *testing.T, r *runner, epoch string, after uint64, wait time.Duration) runnerapi.PrefixEvents {
	t.Helper()
	var out runnerapi.PrefixEvents
	path := fmt.Sprintf("/cache/prefixes?epoch=%s&after=%d&wait=%g", epoch, after, wait.Seconds())
	if code, err := r.getJSON(path, &out); err != nil || code != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, code, err)
	}
	return out
}

// TestPrefixEvents: the digests a generation carries are held in the hot tier once
// its state is saved, move to the SSD when the hot tier is emptied, are dropped when
// no tier holds the state, and a restarted runner starts a new epoch.
func TestPrefixEvents(t *testing.T) {
	m := model(t, "tiny")
	const d1, d2 = "00000000000000a1", "00000000000000a2"
	digests := map[string]string{runnerapi.HeaderPrefixDigests: d1 + "," + d2}
	msgs := []chatMsg{{"role": "user", "content": words(5, 200)}}
	held := func(tier string, tokens int) []runnerapi.PrefixEvent {
		return []runnerapi.PrefixEvent{{Digest: d1, Tier: tier, Tokens: tokens}, {Digest: d2, Tier: tier, Tokens: tokens}}
	}
	want := func(what string, got runnerapi.PrefixEvents, reset bool, events []runnerapi.PrefixEvent) {
		t.Helper()
		if events == nil {
			events = []runnerapi.PrefixEvent{}
		}
		gotJSON, _ := json.Marshal(got.Events)
		wantJSON, _ := json.Marshal(events)
		if got.Reset != reset || !bytes.Equal(gotJSON, wantJSON) {
			t.Errorf("%s: reset %v events %s, want reset %v events %s", what, got.Reset, gotJSON, reset, wantJSON)
		}
	}
	budget := func(r *runner, hot int64) {
		t.Helper()
		if code := r.postJSON("/cache/budget", map[string]any{"hot_bytes": hot}, nil); code != http.StatusOK {
			t.Fatalf("budget: %d", code)
		}
	}

	// Without a hot budget every state goes straight to the SSD tier, on a goroutine of
	// its own: the refresh that follows the save at once must still find it there (the
	// state is pending in the SSD tier before that goroutine runs), or the digests are
	// dropped and no gateway ever learns them.
	t.Run("ssd-only", func(t *testing.T) {
		r := startReady(t, m, "--prompt-cache-block", "32", "--prompt-cache-dir", t.TempDir())
		first := prefixes(t, r, "", 0, 0)
		_, u := chatWith(t, r, digests, msgs, 4)
		want("saved to the SSD only", prefixes(t, r, first.Epoch, 0, 10*time.Second), false, held("ssd", u.PromptTokens))
	})

	t.Run("hot-ssd-restart", func(t *testing.T) {
		dir := t.TempDir()
		flags := []string{"--prompt-cache-block", "32", "--prompt-cache-hot-bytes", fmt.Sprint(1 << 30), "--prompt-cache-dir", dir}
		r := startReady(t, m, flags...)
		first := prefixes(t, r, "", 0, 0)
		want("first listing", first, true, nil)
		if len(first.Epoch) != 16 || first.Seq != 0 {
			t.Fatalf("first listing: %+v", first)
		}
		_, u := chatWith(t, r, digests, msgs, 4)
		got := prefixes(t, r, first.Epoch, 0, 10*time.Second)
		want("saved", got, false, held("hot", u.PromptTokens))
		waitFor(t, 30*time.Second, "the SSD tier to persist the state", func() bool {
			pc := promptCacheStatus(t, r)
			return pc.SavesPending == 0 && pc.SSD.Queued == 0 && pc.SSD.SavesPersisted > 0
		})
		budget(r, 0)
		moved := prefixes(t, r, first.Epoch, got.Seq, 10*time.Second)
		want("hot tier emptied", moved, false, held("ssd", u.PromptTokens))
		want("a caller of an older number", prefixes(t, r, first.Epoch, 0, 0), false, held("ssd", u.PromptTokens))
		want("a full listing", prefixes(t, r, "", 0, 0), true, held("ssd", u.PromptTokens))

		// A long poll with nothing to tell ends when the runner stops.
		type polled struct {
			code int
			out  runnerapi.PrefixEvents
		}
		// Fresh connections, accepted in order: once the probe is answered, the poll's
		// connection was accepted, and a stopping server serves a new connection's
		// request instead of closing it as idle.
		fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		done, wrote := make(chan polled, 1), make(chan struct{})
		go func() {
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
				WroteRequest: func(httptrace.WroteRequestInfo) { close(wrote) }})
			url := fmt.Sprintf("%s/cache/prefixes?epoch=%s&after=%d&wait=30", r.base, first.Epoch, moved.Seq)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			var p polled
			if resp, err := fresh.Do(req); err == nil {
				p.code = resp.StatusCode
				_ = json.NewDecoder(resp.Body).Decode(&p.out)
				resp.Body.Close()
			}
			done <- p
		}()
		<-wrote
		if resp, err := fresh.Get(r.base + "/health"); err != nil {
			t.Fatal(err)
		} else {
			resp.Body.Close()
		}
		start := time.Now()
		r.stop()
		select {
		case p := <-done:
			if p.code != http.StatusOK || p.out.Epoch != first.Epoch || len(p.out.Events) != 0 || time.Since(start) > 15*time.Second {
				t.Errorf("the long poll released by the stop: %d %+v after %v", p.code, p.out, time.Since(start))
			}
		case <-time.After(25 * time.Second):
			t.Fatal("a long poll outlived its runner")
		}

		r = startReady(t, m, flags...)
		again := prefixes(t, r, first.Epoch, moved.Seq, 0)
		if again.Epoch == first.Epoch {
			t.Fatalf("a restarted runner kept epoch %s", again.Epoch)
		}
		want("restarted", again, true, nil)
	})

	t.Run("dropped-without-ssd", func(t *testing.T) {
		r := startReady(t, m, "--prompt-cache-block", "32", "--prompt-cache-hot-bytes", fmt.Sprint(1<<30))
		first := prefixes(t, r, "", 0, 0)
		_, u := chatWith(t, r, digests, msgs, 4)
		got := prefixes(t, r, first.Epoch, 0, 10*time.Second)
		want("saved", got, false, held("hot", u.PromptTokens))
		if cc := clearCache(t, r); cc.HotEntriesCleared == 0 {
			t.Fatalf("the clear dropped nothing: %+v", cc)
		}
		want("hot tier cleared", prefixes(t, r, first.Epoch, got.Seq, 10*time.Second), false,
			[]runnerapi.PrefixEvent{{Digest: d1}, {Digest: d2}})
		want("nothing held", prefixes(t, r, "", 0, 0), true, nil)
	})
}

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// streamed is a streamed greedy chat's answer, time to first token and usage.
type streamed struct {
	reply string
	ttft  time.Duration
	usage runnerapi.Usage
}

// timedChat sends a greedy streamed chat of msgs and times its first token.
func timedChat(t *testing.T, r *runner, msgs []chatMsg, maxTokens int) streamed {
	t.Helper()
	body := map[string]any{"model": "test", "temperature": 0, "max_tokens": maxTokens, "messages": msgs,
		"stream": true, "stream_options": map[string]any{"include_usage": true}}
	var out streamed
	start := time.Now()
	_, reply, done, errEv := streamChat(t, r, context.Background(), body, func(c chunk) bool {
		if c.Usage != nil {
			out.usage = *c.Usage
		}
		if out.ttft == 0 && len(c.Choices) > 0 && c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
			out.ttft = time.Since(start)
		}
		return true
	})
	if !done || errEv != nil {
		t.Errorf("stream ended early: %+v", errEv)
	}
	out.reply = reply
	return out
}

// pairApart sends first, waits until the runner has admitted it (a slot is busy), then
// sends second while first is still prefilling, and returns both answers.
func pairApart(t *testing.T, r *runner, first, second []chatMsg, maxTokens int) (streamed, streamed) {
	t.Helper()
	var a streamed
	doneA := make(chan struct{})
	go func() {
		defer close(doneA)
		a = timedChat(t, r, first, maxTokens)
	}()
	waitFor(t, 30*time.Second, "the first request to take a slot", func() bool { return r.status().SlotsBusy > 0 })
	b := timedChat(t, r, second, maxTokens)
	<-doneA
	return a, b
}

// TestPromptCacheInflightPrefix: two conversations that share a long system prompt,
// the second sent while the first is still prefilling it, on one runner with two
// slots. The second waits for the first's prefill and takes the shared blocks' KV
// instead of prefilling them again: it reports them as cached tokens, its time to
// first token is well below that of an unrelated prompt of the same length sent the
// same way (which prefills alongside the first), and both answer exactly what a cold
// runner does (greedy).
func TestPromptCacheInflightPrefix(t *testing.T) {
	m := specModel(t, "llama31", testassets.Llama31Spec)
	const block = 64
	conv := func(systemSeed, userSeed uint64) []chatMsg {
		return []chatMsg{{"role": "system", "content": "You are a careful assistant. " + words(systemSeed, 3000)},
			{"role": "user", "content": "Tell me about the " + words(userSeed, 40)}}
	}
	a, b := conv(7, 8), conv(7, 9)    // share the system prompt
	a2, u := conv(21, 8), conv(22, 9) // share nothing beyond the template's header

	// On a GPU the whole prompt prefills in a few milliseconds, before b can arrive;
	// small batches keep a's prefill in flight for as many steps as on a CPU. Both
	// runners chunk the prompts alike, so the cold answers stay comparable.
	slots := []string{"--parallel", "2"}
	if gpuSuite() {
		slots = append(slots, "--batch", "16")
	}
	cold := startReady(t, m, slots...)
	shared := sharedTokens(tokensOf(t, cold, a), tokensOf(t, cold, b))
	if shared/block < 16 {
		t.Fatalf("the conversations share %d tokens, under 16 blocks of %d", shared, block)
	}
	if s := sharedTokens(tokensOf(t, cold, a2), tokensOf(t, cold, u)); s >= block {
		t.Fatalf("the unrelated conversations share %d tokens, a full block", s)
	}
	if n, m := len(tokensOf(t, cold, b)), len(tokensOf(t, cold, u)); n*10 < m*9 || m*10 < n*9 {
		t.Fatalf("b has %d prompt tokens, u %d: not the same length", n, m)
	}
	coldReply := map[string]string{}
	for name, msgs := range map[string][]chatMsg{"a": a, "b": b, "u": u} {
		coldReply[name] = timedChat(t, cold, msgs, 16).reply
	}
	cold.stop()

	r := startReady(t, m, append(slots, "--prompt-cache-block", fmt.Sprint(block),
		"--prompt-cache-hot-bytes", fmt.Sprint(1<<30))...)
	ra, rb := pairApart(t, r, a, b, 16)
	pc := promptCacheStatus(t, r)
	if got := cachedTokens(rb.usage); got < shared/block*block || got > shared {
		t.Errorf("b: %d cached tokens, want the %d shared tokens' full blocks (%d) or more, at most %d",
			got, shared, shared/block*block, shared)
	}
	if pc.InflightWaits != 1 || pc.InflightShares != 1 || pc.InflightSharedTokens < int64(shared/block*block) {
		t.Errorf("b did not share a's in-flight prefix: %+v", pc)
	}
	if ra.reply != coldReply["a"] || rb.reply != coldReply["b"] {
		t.Errorf("replies a %q b %q, a cold runner says a %q b %q", ra.reply, rb.reply, coldReply["a"], coldReply["b"])
	}

	_, ru := pairApart(t, r, a2, u, 16)
	if got := cachedTokens(ru.usage); got >= block {
		t.Errorf("unrelated u: %d cached tokens", got)
	}
	if after := promptCacheStatus(t, r); after.InflightWaits != pc.InflightWaits {
		t.Errorf("unrelated u waited on a2: %+v", after)
	}
	if ru.reply != coldReply["u"] {
		t.Errorf("u: reply %q, a cold runner says %q", ru.reply, coldReply["u"])
	}
	t.Logf("TTFT: b sharing a's in-flight prefix %v, unrelated u prefilling alongside a2 %v (%d shared tokens)",
		rb.ttft, ru.ttft, shared)
	// Sharing, b waits for a's prefill alone; u prefills its whole prompt alongside
	// a2's, which shares the steps' batches with it.
	if rb.ttft <= 0 || ru.ttft <= 0 || float64(rb.ttft) > 0.8*float64(ru.ttft) {
		t.Errorf("b's TTFT %v is not well below u's %v", rb.ttft, ru.ttft)
	}
}

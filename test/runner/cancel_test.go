package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// TestCancelEndsAStreamWithItsUsage: POST /cancel naming a stream's request id ends
// the stream as a stop condition would (finish_reason "cancelled", then the usage and
// [DONE]); the usage counts exactly the tokens the stream carried (one logprob each),
// and the slot is free about as soon as when the client drops its connection.
func TestCancelEndsAStreamWithItsUsage(t *testing.T) {
	const maxTokens = 500
	r := startReady(t, model(t, "tiny"))
	open := func(id string) *http.Response {
		body := chatBody("Tell me a long story about a river", maxTokens, true)
		body["stream_options"] = map[string]any{"include_usage": true}
		body["logprobs"] = true
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, r.base+"/v1/chat/completions", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(runnerapi.HeaderRequestID, id)
		resp, err := r.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %s: %d", id, resp.StatusCode)
		}
		return resp
	}
	// idle is how long after since the runner's slots were all free (polled every ms).
	idle := func(since time.Time) time.Duration {
		for deadline := time.Now().Add(10 * time.Second); r.status().SlotsBusy != 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the slot is still busy 10 s after its request ended")
			}
		}
		return time.Since(since)
	}

	resp := open("req-1")
	defer resp.Body.Close()
	var (
		tokens    int
		finish    string
		usage     *runnerapi.Usage
		cancelled time.Time
		freed     time.Duration
	)
	_, done, err := readSSE(t, resp.Body, func(ev sseEvent) bool {
		var c runnerapi.ChatCompletionChunk
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("bad chunk %q: %v", ev.data, err)
		}
		for _, ch := range c.Choices {
			if ch.Logprobs != nil {
				tokens += len(ch.Logprobs.Content)
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		if tokens >= 3 && cancelled.IsZero() {
			cancelled = time.Now()
			var out runnerapi.Cancelled
			if code := r.postJSON("/cancel", runnerapi.Cancel{ID: "req-1"}, &out); code != http.StatusOK || !out.Found {
				t.Fatalf("POST /cancel req-1: %d %+v, want 200 found", code, out)
			}
			freed = idle(cancelled)
		}
		return true
	})
	if err != nil || !done {
		t.Fatalf("the cancelled stream ended with done %v, %v; want [DONE]", done, err)
	}
	if finish != runnerapi.FinishCancelled || usage == nil {
		t.Fatalf("finish %q, usage %+v; want %q and a usage", finish, usage, runnerapi.FinishCancelled)
	}
	if usage.CompletionTokens != tokens || tokens >= maxTokens || usage.PromptTokens == 0 {
		t.Errorf("usage %+v for %d tokens streamed (max %d): want completion_tokens = the tokens streamed, fewer than max",
			*usage, tokens, maxTokens)
	}
	var out runnerapi.Cancelled
	if code := r.postJSON("/cancel", runnerapi.Cancel{ID: "req-1"}, &out); code != http.StatusOK || out.Found {
		t.Errorf("POST /cancel of an answered request: %d %+v, want 200 not found", code, out)
	}
	if code := r.postJSON("/cancel", runnerapi.Cancel{}, nil); code != http.StatusBadRequest {
		t.Errorf("POST /cancel without an id: %d, want 400", code)
	}

	// The same stream dropped by its client, as before: how soon its slot is free.
	drop := open("req-2")
	_, _, _ = readSSE(t, drop.Body, func(sseEvent) bool { return false }) // one event: generating
	dropped := time.Now()
	drop.Body.Close()
	freedByDrop := idle(dropped)
	t.Logf("slot free %v after POST /cancel, %v after the client dropped the connection", freed, freedByDrop)
	if freed > freedByDrop+time.Second {
		t.Errorf("a cancel freed the slot in %v, a dropped connection in %v", freed, freedByDrop)
	}
}

// TestAbortReportsTheUsageBeforeTheError: a stream that asked for usage and that the
// runner ends with an error midway (here POST /abort, as the agent sends to unload a
// model) gets the usage of what was generated before the error event, so that an
// answer that fails midway is metered too.
func TestAbortReportsTheUsageBeforeTheError(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	body := chatBody("Tell me a long story about a mountain", 500, true)
	body["stream_options"] = map[string]any{"include_usage": true}
	body["logprobs"] = true
	resp, err := r.post(context.Background(), "/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var (
		tokens  int
		usage   *runnerapi.Usage
		errored bool
		aborted bool
	)
	_, _, err = readSSE(t, resp.Body, func(ev sseEvent) bool {
		var c struct {
			runnerapi.ChatCompletionChunk
			Error *runnerapi.Error `json:"error"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("bad chunk %q: %v", ev.data, err)
		}
		if c.Error != nil {
			if usage == nil {
				t.Errorf("the error event %q came without a usage chunk before it", ev.data)
			}
			errored = true
			return false
		}
		for _, ch := range c.Choices {
			if ch.Logprobs != nil {
				tokens += len(ch.Logprobs.Content)
			}
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		if tokens >= 3 && !aborted {
			aborted = true
			var out runnerapi.Abort
			if code := r.postJSON("/abort", nil, &out); code != http.StatusOK || out.Aborted != 1 {
				t.Fatalf("POST /abort: %d %+v", code, out)
			}
		}
		return true
	})
	if err != nil || !errored || usage == nil {
		t.Fatalf("the aborted stream: error event %v, usage %+v, %v", errored, usage, err)
	}
	if usage.CompletionTokens != tokens || usage.PromptTokens == 0 {
		t.Errorf("usage %+v for %d tokens streamed: want completion_tokens = the tokens streamed", *usage, tokens)
	}
}

// TestCancelEndsAWholeAnswerWithItsUsage: a request that is not streamed, with two
// choices, cancelled while it generates, is answered at once with what each choice
// generated so far (finish_reason "cancelled") and a usage that counts exactly those
// tokens (one logprob each).
func TestCancelEndsAWholeAnswerWithItsUsage(t *testing.T) {
	const maxTokens = 3000
	r := startReady(t, model(t, "tiny"), "--parallel", "2", "--ctx", "8192")
	// cancelled sends request id, cancels it once both choices have a slot and checks
	// the answer; it returns the tokens the choices had generated.
	cancelled := func(id string) int {
		body := chatBody("Tell me a long story about the sea", maxTokens, false)
		body["n"], body["logprobs"] = 2, true
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, r.base+"/v1/chat/completions", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(runnerapi.HeaderRequestID, id)
		type result struct {
			out runnerapi.ChatCompletion
			err error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := r.client.Do(req)
			if err != nil {
				done <- result{err: err}
				return
			}
			defer resp.Body.Close()
			var res result
			res.err = json.NewDecoder(resp.Body).Decode(&res.out)
			done <- res
		}()
		// Both choices hold a slot, then the KV cache grew three times: a prompt takes
		// at most one step a choice, so at least one step decoded a token.
		waitFor(t, 10*time.Second, "both choices generating", func() bool { return r.status().SlotsBusy == 2 })
		grown, kv := 0, r.status().KVCellsUsed
		waitFor(t, 10*time.Second, "the choices decoding", func() bool {
			if now := r.status().KVCellsUsed; now > kv {
				grown, kv = grown+1, now
			}
			return grown >= 3
		})
		var c runnerapi.Cancelled
		if code := r.postJSON("/cancel", runnerapi.Cancel{ID: id}, &c); code != http.StatusOK || !c.Found {
			t.Fatalf("POST /cancel: %d %+v, want 200 found", code, c)
		}
		var res result
		select {
		case res = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("no answer 10 s after the cancel")
		}
		if res.err != nil || len(res.out.Choices) != 2 || res.out.Usage == nil {
			t.Fatalf("answer %+v, %v; want two choices and a usage", res.out, res.err)
		}
		tokens := 0
		for _, ch := range res.out.Choices {
			if ch.FinishReason != runnerapi.FinishCancelled || ch.Logprobs == nil {
				t.Fatalf("choice %d: finish %q, logprobs %v; want %q with logprobs", ch.Index, ch.FinishReason,
					ch.Logprobs != nil, runnerapi.FinishCancelled)
			}
			tokens += len(ch.Logprobs.Content)
		}
		if u := res.out.Usage; u.CompletionTokens != tokens || tokens >= 2*maxTokens || u.PromptTokens == 0 {
			t.Fatalf("usage %+v for %d tokens in the choices (max %d): want completion_tokens = those tokens", *u, tokens, 2*maxTokens)
		}
		return tokens
	}
	// A cancel that lands before the first token compares nothing: try again.
	for i := range 5 {
		if n := cancelled(fmt.Sprintf("whole-%d", i)); n > 0 {
			t.Logf("cancelled after %d tokens of two choices", n)
			return
		}
	}
	t.Fatal("5 requests were each cancelled before their first token: nothing was compared")
}

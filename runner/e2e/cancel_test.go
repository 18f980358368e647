package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/macfleet/macfleet/runner/api"
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
		req.Header.Set(api.HeaderRequestID, id)
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
		usage     *api.Usage
		cancelled time.Time
		freed     time.Duration
	)
	_, done, err := readSSE(t, resp.Body, func(ev sseEvent) bool {
		var c api.ChatCompletionChunk
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
			var out api.Cancelled
			if code := r.postJSON("/cancel", api.Cancel{ID: "req-1"}, &out); code != http.StatusOK || !out.Found {
				t.Fatalf("POST /cancel req-1: %d %+v, want 200 found", code, out)
			}
			freed = idle(cancelled)
		}
		return true
	})
	if err != nil || !done {
		t.Fatalf("the cancelled stream ended with done %v, %v; want [DONE]", done, err)
	}
	if finish != api.FinishCancelled || usage == nil {
		t.Fatalf("finish %q, usage %+v; want %q and a usage", finish, usage, api.FinishCancelled)
	}
	if usage.CompletionTokens != tokens || tokens >= maxTokens || usage.PromptTokens == 0 {
		t.Errorf("usage %+v for %d tokens streamed (max %d): want completion_tokens = the tokens streamed, fewer than max",
			*usage, tokens, maxTokens)
	}
	var out api.Cancelled
	if code := r.postJSON("/cancel", api.Cancel{ID: "req-1"}, &out); code != http.StatusOK || out.Found {
		t.Errorf("POST /cancel of an answered request: %d %+v, want 200 not found", code, out)
	}
	if code := r.postJSON("/cancel", api.Cancel{}, nil); code != http.StatusBadRequest {
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
		usage   *api.Usage
		errored bool
		aborted bool
	)
	_, _, err = readSSE(t, resp.Body, func(ev sseEvent) bool {
		var c struct {
			api.ChatCompletionChunk
			Error *api.Error `json:"error"`
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
			var out api.Abort
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

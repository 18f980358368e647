package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// continuedStreams is how many streams TestStreamsSurviveARunnerKill sends at once, as
// the operator's test in issue 43 did: both replicas' slots and the gateway's queue are
// full when the runner is killed.
const continuedStreams = 48

// survivorTokens is each stream's max_tokens.
const survivorTokens = 400

// TestStreamsSurviveARunnerKill: streaming chats through the gateway to a two-replica
// deployment, one replica's runner killed with SIGKILL while they stream, or its
// agent's whole process, or its agent stopped (SIGSTOP) until its Lease expires and
// the gateway counts the Mac lost: every stream completes as an uninterrupted one does (valid
// SSE, one id, one usage, one [DONE], no error event, a usage that counts each token
// the client got once and no more than max_tokens), those the failed replica was
// writing continued on the other replica.
func TestStreamsSurviveARunnerKill(t *testing.T) {
	t.Run("runner", func(t *testing.T) {
		surviveWith(t, continuedStreams, survivorStream, killRunner, 3, nil)
	})
	t.Run("agent stopped", func(t *testing.T) {
		m := macDown{down: fleet.PauseAgent, up: fleet.ResumeAgent}
		surviveWith(t, continuedStreams, survivorStream, m.kill, 3, m.restore)
	})
	t.Run("agent", func(t *testing.T) {
		m := macDown{down: fleet.KillAgent, up: fleet.StartAgent}
		surviveWith(t, continuedStreams, survivorStream, m.kill, 3, m.restore)
	})
}

// macDown takes a Mac's agent down as a kill of surviveWith (down) and brings it back
// (up) before the next round and after the test, so that a round whose kill broke no
// stream can be tried again with both Macs.
type macDown struct {
	down, up func(node string) error
	node     string
}

func (m *macDown) kill(t *testing.T, node string, _ int) {
	if err := m.down(node); err != nil {
		t.Fatal(err)
	}
	m.node = node
	t.Cleanup(func() { m.restore(t) }) // the Mac comes back for the tests after this one
}

// restore brings the Mac taken down back and waits until it is Ready; nothing when
// none is down.
func (m *macDown) restore(t *testing.T) {
	if m.node == "" {
		return
	}
	node := m.node
	m.node = ""
	if err := m.up(node); err != nil {
		t.Fatal(err)
	}
	if err := fleet.WaitNodeReady(context.Background(), node); err != nil {
		t.Fatal(err)
	}
}

// killRunner kills a replica's runner with SIGKILL.
func killRunner(t *testing.T, _ string, pid int) {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing runner %d: %v", pid, err)
	}
}

// streamer streams one answer to model as client i, adds 1 to streaming once it has
// content, and checks what it read.
type streamer func(ctx context.Context, model string, i int, streaming *atomic.Int32) streamResult

// surviveWith runs n streams of stream to a new two-replica deployment, calls kill
// with the first replica's Mac and runner PID while that replica writes some of them,
// and checks every stream; in up to rounds rounds (each with a new deployment) while
// a kill broke no stream: the victim's requests may all be before their first byte
// when it falls (they are retried, not continued), most often with short answers or
// on a loaded machine. restore, when not nil, undoes a kill before the next round.
func surviveWith(t *testing.T, n int, stream streamer, kill func(t *testing.T, node string, pid int), rounds int, restore func(*testing.T)) {
	for round := 1; ; round++ {
		if restore != nil && round > 1 {
			restore(t)
		}
		continued, victim := survivalRound(t, n, stream, kill)
		switch {
		case continued > 0 || t.Failed():
			return
		case round == rounds:
			t.Errorf("no stream was continued in %d rounds: the kill broke none (last: %s)", rounds, victim)
			return
		}
		t.Logf("round %d: the kill broke no stream of %s; again", round, victim)
	}
}

// survivalRound runs one round of surviveWith: how many streams were continued, and
// the victim's replica and runner.
func survivalRound(t *testing.T, n int, stream streamer, kill func(t *testing.T, node string, pid int)) (int, string) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "survivor", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Placement.Strategy = v1alpha1.Spread
		// A continuation's prompt holds the text sent, tokenized again: the
		// random-weight model's text (byte pieces of characters it never completes,
		// sent as U+FFFD) comes back up to 2.6 times as many tokens as were generated
		// (600 tokens as 1,548), which a context of 1024 refused.
		md.Spec.Engine.Settings = engine.Settings{ContextLength: 2048, Parallel: 2}
	}))
	defer removeDeployment(t, ns, "survivor") // a next round's replicas need the room
	sides := replicaSides(t, waitReady(t, ns, "survivor", 2, 3*time.Minute))

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var streaming atomic.Int32 // streams that have content
	results := make([]streamResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i] = stream(ctx, ns+"/survivor", i, &streaming) })
	}
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	// Kill a replica that writes a stream once both replicas' slots are writing.
	victim := killAWriter(ctx, t, sides, &streaming, 4, ended, kill)
	killed := time.Now()
	<-ended
	continued := countContinued(t, results)
	if victim < 0 {
		return continued, "none: every stream ended before a replica was seen writing one"
	}
	t.Logf("%d streams, %d continued on the other replica; all ended %v after the kill", n, continued,
		time.Since(killed).Round(time.Millisecond))
	return continued, fmt.Sprintf("runner %d of %s", sides[victim].pid, sides[victim].key)
}

// activeRequests is how many requests the agent at addr reports for model key.
func activeRequests(ctx context.Context, addr, key string) int {
	var st struct {
		Models []struct {
			Name           string `json:"name"`
			ActiveRequests int    `json:"activeRequests"`
		} `json:"models"`
	}
	if agentGet(ctx, addr, "/api/status", &st) != nil {
		return 0
	}
	for _, m := range st.Models {
		if m.Name == key {
			return m.ActiveRequests
		}
	}
	return 0
}

// streamResult is what one client of TestStreamsSurviveARunnerKill saw: err says what
// was wrong with its stream ("" for nothing); continued is its X-Macfleet-Continued.
type streamResult struct {
	err, continued string
}

// postStream posts a streamed request's body to the gateway's path: its 200 response,
// or what went wrong.
func postStream(ctx context.Context, path, body string, hdr ...string) (*http.Response, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fleet.GatewayURL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err.Error()
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Sprintf("status %d", resp.StatusCode)
	}
	return resp, ""
}

// survivorStream streams one chat and checks it as a client would parse it.
func survivorStream(ctx context.Context, model string, i int, streaming *atomic.Int32) streamResult {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"temperature":0,
		"logprobs":true,"messages":[{"role":"user","content":"Story %d: tell me a very long story about the sea."}]}`, model, survivorTokens, i)
	resp, problem := postStream(ctx, "/v1/chat/completions", body)
	if problem != "" {
		return streamResult{err: problem}
	}
	defer resp.Body.Close()
	ids, usages, counted := map[string]bool{}, 0, false
	delivered, finish := 0, "" // the tokens the client got (a logprob each), the finish reason
	var usage runnerapi.Usage
	dones, problem := readChunks(resp.Body, func(c runnerapi.ChatCompletionChunk) {
		ids[c.ID] = true
		if c.Usage != nil {
			usages++
			usage = *c.Usage
		}
		for _, ch := range c.Choices {
			if ch.Logprobs != nil {
				delivered += len(ch.Logprobs.Content)
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		if !counted && len(c.Choices) > 0 && c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
			counted = true
			streaming.Add(1)
		}
	})
	if problem != "" {
		return streamResult{err: problem}
	}
	res := streamResult{continued: resp.Trailer.Get("X-Macfleet-Continued")}
	// Usage counts each token the client got once, a continued answer's too (the
	// gateway tells the continuing replica how many it forwarded): a logprob a token,
	// and the end-of-generation token, which has none, for an answer that stopped.
	if finish == "stop" {
		delivered++
	}
	switch {
	case dones != 1 || usages != 1 || len(ids) != 1:
		res.err = fmt.Sprintf("%d [DONE], %d usage chunks, ids %v; want one each", dones, usages, ids)
	case usage.PromptTokens == 0 || usage.CompletionTokens == 0 || usage.CompletionTokens > survivorTokens ||
		usage.TotalTokens != usage.PromptTokens+usage.CompletionTokens:
		res.err = fmt.Sprintf("usage %+v (continued %q)", usage, res.continued)
	case usage.CompletionTokens != delivered:
		res.err = fmt.Sprintf("usage %+v counts %d completion tokens, the client got %d (finish %q, continued %q)",
			usage, usage.CompletionTokens, delivered, finish, res.continued)
	}
	return res
}

// readChunks reads a Chat Completions stream as a client parses it, calling each for
// every chunk: how many [DONE] it had, or what was wrong with it (an error event, a
// line that is not an event, anything after [DONE], a cut).
func readChunks(body io.Reader, each func(runnerapi.ChatCompletionChunk)) (dones int, problem string) {
	br := bufio.NewReader(body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if line != "" {
				return dones, fmt.Sprintf("stream cut in an event: %q, %v", line, err)
			}
			return dones, ""
		}
		if line == "\n" || (strings.HasPrefix(line, ":") && dones == 0) {
			continue // a comment (the gateway's keep-alive while it holds the stream) is no event
		}
		data, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "data: ")
		if !ok || dones > 0 {
			return dones, fmt.Sprintf("line %q (after %d [DONE])", line, dones)
		}
		if data == "[DONE]" {
			dones++
			continue
		}
		var c runnerapi.ChatCompletionChunk
		var e struct{ Error json.RawMessage }
		if json.Unmarshal([]byte(data), &e); e.Error != nil {
			return dones, "error event " + data
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return dones, fmt.Sprintf("chunk %q: %v", data, err)
		}
		each(c)
	}
}

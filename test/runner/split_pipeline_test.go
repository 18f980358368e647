package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// pipelinePrompts are four prompts of different lengths, answered at once.
var pipelinePrompts = []string{
	"Tell me a story about the sea.",
	"List three prime numbers and explain why.",
	"What is the capital of France? Answer in one sentence, then describe the city.",
	"Write a haiku.",
}

// greedyAtOnce sends every prompt at the same time and returns the greedy answers in
// the prompts' order.
func greedyAtOnce(t *testing.T, r *runner, prompts []string, maxTokens int) []greedyTokens {
	t.Helper()
	out := make([]greedyTokens, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = greedyWhole(t, r, p, maxTokens)
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// TestSplitModelPipelinedMatchesOneProcess: a split runner decoding its four slots in
// two llama contexts (--split-pipeline 2: two slots each, each context on its own
// goroutine, sharing the workers' links) answers four concurrent greedy chats token
// for token as one process with four slots does, over one worker and over two; and one
// chat alone, streamed.
func TestSplitModelPipelinedMatchesOneProcess(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	const maxTokens = 40
	one := startReady(t, m, "--parallel", "4")
	want := greedyAtOnce(t, one, pipelinePrompts, maxTokens)
	wantStream := greedyStream(t, one, pipelinePrompts[0], maxTokens)
	one.stop()

	for _, tc := range []struct {
		name   string
		layers []int
	}{{"two processes", []int{3}}, {"three processes", []int{2, 2}}} {
		t.Run(tc.name, func(t *testing.T) {
			var workers []*worker
			for range tc.layers {
				workers = append(workers, startWorker(t, m))
			}
			r := startReady(t, m, append(splitFlags(workers, tc.layers...), "--parallel", "4", "--split-pipeline", "2")...)
			// Twice: the second round finds every slot holding an earlier prompt.
			for round := range 2 {
				got := greedyAtOnce(t, r, pipelinePrompts, maxTokens)
				for i, p := range pipelinePrompts {
					sameTokens(t, p, got[i], want[i])
				}
				t.Logf("round %d: %d answers match", round, len(got))
			}
			sameTokens(t, "streamed", greedyStream(t, r, pipelinePrompts[0], maxTokens), wantStream)
			st := r.status()
			if st.SlotsTotal != 4 || st.SlotsBusy != 0 {
				t.Errorf("status: %d slots, %d busy; want 4 and 0", st.SlotsTotal, st.SlotsBusy)
			}
			for i, ws := range st.Split {
				if ws.Error != "" || ws.Computes == 0 {
					t.Errorf("split worker %d: %+v", i, ws)
				}
			}
		})
	}
}

// occupy opens a long greedy stream and returns once the runner has busy slots in
// use; the stream ends when the test does or cancel is called.
func occupy(t *testing.T, r *runner, seed uint64, busy int) (cancel context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	resp, err := r.post(ctx, "/v1/chat/completions", chatBody(words(seed, 40), 4000, true))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	for deadline := time.Now().Add(10 * time.Second); r.status().SlotsBusy < busy; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots busy 10 s after opening a stream, want %d", r.status().SlotsBusy, busy)
		}
	}
	return cancel
}

// TestSplitModelPipelinedPromptCache: on a pipelined split runner (two contexts of two
// slots), a conversation's first turn runs in the first context, and its second turn,
// sent while three long streams fill the first context and half the second, runs in
// the second context: it restores the state the first context saved (the hot tier is
// shared) as many tokens deep as one process does, and answers the same.
func TestSplitModelPipelinedPromptCache(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	conv := &conversation{users: []string{words(1, 200), words(2, 100)}}
	flags := []string{"--prompt-cache-block", fmt.Sprint(pcBlock), "--prompt-cache-hot-bytes", fmt.Sprint(256 << 20)}
	turns := func(r *runner, busy func()) ([]string, int) {
		reply1, _ := chatTurn(t, r, conv.messages(0), pcMaxTokens)
		conv.replies = append(conv.replies[:0], reply1)
		busy()
		reply2, u := chatTurn(t, r, conv.messages(1), pcMaxTokens)
		return []string{reply1, reply2}, cachedTokens(u)
	}
	// One process with one slot: another chat between the turns takes the slot, so
	// turn 2 restores from the hot tier there too.
	one := startReady(t, m, flags...)
	want, wantRestored := turns(one, func() { chatTurn(t, one, []chatMsg{{"role": "user", "content": words(3, 150)}}, pcMaxTokens) })
	one.stop()

	w := startWorker(t, m)
	r := startReady(t, m, append(splitFlags([]*worker{w}, 3), append(flags, "--parallel", "4", "--split-pipeline", "2")...)...)
	got, restored := turns(r, func() {
		// Each stream joins the context with the most free slots: the first, the
		// second, the first.
		for k := range 3 {
			occupy(t, r, uint64(10+k), k+1)
		}
	})
	pc := promptCacheStatus(t, r)
	if restored == 0 || restored != wantRestored {
		t.Errorf("turn 2 restored %d tokens from the prompt cache, one process %d (cache %+v)", restored, wantRestored, pc)
	}
	if pc.Restores == 0 {
		t.Errorf("no state was restored (cache %+v)", pc)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("reply %d: pipelined split %q, one process %q", i, got[i], want[i])
		}
	}
	t.Logf("turn 2 restored %d tokens; cache %+v", restored, pc)
}

// tracedChat sends a greedy chat as part of trace traceID and returns its completion
// tokens.
func tracedChat(r *runner, traceID, prompt string, maxTokens int) (tokens, drafted int64, err error) {
	body, _ := json.Marshal(chatBody(prompt, maxTokens, false))
	req, err := http.NewRequest(http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	var c runnerapi.ChatCompletion
	if err != nil || resp.StatusCode != http.StatusOK || json.Unmarshal(b, &c) != nil || c.Usage == nil {
		return 0, 0, fmt.Errorf("chat: %d %v %s", resp.StatusCode, err, b)
	}
	return int64(c.Usage.CompletionTokens), int64(accepted(c)), nil
}

// TestSplitModelPipelinedMetersEachContext: on a pipelined split runner, two chats
// decoded at once in the two contexts each get their own context's link figures in
// their spans: together they add up to the links' growth in /status (nothing counted
// twice), their link wait is at least the links' (it also counts waiting for the other
// context's commands) and their head compute adds up to the runner's. The same with
// two workers, the first pushing to the second (--next): the answers a context reads
// for the other are counted once, by the thread that read them.
func TestSplitModelPipelinedMetersEachContext(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	t.Run("one worker", func(t *testing.T) {
		w := startWorker(t, m)
		meterEachContext(t, startReady(t, m, append(splitFlags([]*worker{w}, 3), "--parallel", "4", "--split-pipeline", "2", "--trace-relay")...))
	})
	t.Run("worker to worker", func(t *testing.T) {
		workers := startChain(t, m, 2)
		meterEachContext(t, startReady(t, m, append(splitFlags(workers, 2, 2), "--parallel", "4", "--split-pipeline", "2", "--trace-relay")...))
	})
}

func meterEachContext(t *testing.T, r *runner) {
	before := r.status()
	ids := []string{"4bf92f3577b34da6a3ce929d0e0e4736", "7c1e2f3577b34da6a3ce929d0e0e4799"}
	tokens, drafted := make([]int64, len(ids)), make([]int64, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tokens[i], drafted[i], errs[i] = tracedChat(r, id, pipelinePrompts[i], 48)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil || tokens[i] < 8 {
			t.Fatalf("chat %d: %d tokens, %v; want at least 8", i, tokens[i], err)
		}
	}
	after := r.status()
	stages := drainTraces(t, r, ids...)
	var sum stageLink
	for i, id := range ids {
		p, d := stages[id][0], stages[id][1]
		t.Logf("chat %d: %d tokens (%d of them drafted); prefill %+v; decode %+v", i, tokens[i], drafted[i], p, d)
		// A decode step gives one token and the drafted tokens it verified (in the
		// same round trip, speculative decoding).
		if d.roundTrips < tokens[i]-drafted[i]-1 || d.head <= 0 || d.compute <= 0 {
			t.Errorf("chat %d's runner.decode %+v: want a round trip per decode step after the first, head and worker compute", i, d)
		}
		for _, st := range []stageLink{p, d} {
			sum.sent += st.sent
			sum.received += st.received
			sum.roundTrips += st.roundTrips
			sum.wait += st.wait
			sum.compute += st.compute
			sum.head += st.head
		}
	}
	d0, d1 := linkTotals(before), linkTotals(after)
	if got, want := sum.sent, int64(d1.BytesSent-d0.BytesSent); got != want {
		t.Errorf("the spans count %d bytes sent, /status %d", got, want)
	}
	if got, want := sum.received, int64(d1.BytesReceived-d0.BytesReceived); got != want {
		t.Errorf("the spans count %d bytes received, /status %d", got, want)
	}
	if got, want := sum.roundTrips, int64(d1.RoundTrips-d0.RoundTrips); got != want {
		t.Errorf("the spans count %d round trips, /status %d", got, want)
	}
	if got, want := sum.compute, d1.WorkerComputeSeconds-d0.WorkerComputeSeconds; math.Abs(got-want) > 1e-6 {
		t.Errorf("the spans count %.6fs of worker compute, /status %.6fs", got, want)
	}
	if got, want := sum.wait, d1.LinkWaitSeconds-d0.LinkWaitSeconds; got < want-1e-6 {
		t.Errorf("the spans count %.6fs of link wait, less than /status's %.6fs", got, want)
	}
	if got, want := sum.head, after.SplitHeadComputeSeconds-before.SplitHeadComputeSeconds; math.Abs(got-want) > 1e-6 {
		t.Errorf("the spans count %.6fs of head compute, /status %.6fs", got, want)
	}
}

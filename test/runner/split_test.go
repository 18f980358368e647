package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/syncbuf"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// splitSpec is Llama31Spec (the real Llama 3 vocabulary and chat template) with six
// layers, so that a runner and one or two workers each hold some; seed picks the
// weights (two seeds: two files whose metadata and tensor table are identical).
func splitSpec(seed uint64) func() (ggufsynth.Spec, error) {
	return func() (ggufsynth.Spec, error) {
		s, err := testassets.Llama31Spec()
		s.Name, s.Layers, s.Seed = "macfleet-split", 6, seed
		return s, err
	}
}

// splitLayerBytes is the size of one layer's weights in splitSpec's model: F16
// attention (q and o 64x64, k and v 64x32) and feed-forward (three 64x128) matrices.
const splitLayerBytes = 2 * (2*64*64 + 2*64*32 + 3*64*128)

// worker is one started `macfleet-runner worker` process.
type worker struct {
	cmd    *exec.Cmd
	addr   string
	stderr *syncbuf.Buffer
	exited chan struct{}
}

// startWorker starts a worker on modelPath (with flags added), waits for its
// listening line, and registers a cleanup that stops it.
func startWorker(t testing.TB, modelPath string, flags ...string) *worker {
	t.Helper()
	return startWorkerStdin(t, "", modelPath, flags...)
}

// startWorkerStdin is startWorker with stdin ("" none) on the worker's standard input.
func startWorkerStdin(t testing.TB, stdin, modelPath string, flags ...string) *worker {
	t.Helper()
	args := append([]string{"worker", "--listen", "127.0.0.1:0", "--model", modelPath, "--threads", "1"}, flags...)
	cmd := exec.Command(runnerBinary(t), args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w := &worker{cmd: cmd, stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		close(w.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-w.exited
		if t.Failed() {
			t.Logf("worker stderr:\n%s", tail(w.stderr.String(), 4000))
		}
	})
	select {
	case line, ok := <-firstLine(stdout):
		var ev runnerapi.ListeningEvent
		if !ok || json.Unmarshal([]byte(line), &ev) != nil || ev.Event != "listening" || ev.Addr == "" {
			t.Fatalf("worker's first line %q; stderr:\n%s", line, w.stderr.String())
		}
		w.addr = ev.Addr
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not announce its listener within 30s; stderr:\n%s", w.stderr.String())
	}
	return w
}

// splitFlags gives each worker its layers, in order.
func splitFlags(workers []*worker, layers ...int) []string {
	var flags []string
	for i, w := range workers {
		flags = append(flags, "--split-worker", w.addr, "--split-layers", strconv.Itoa(layers[i]))
	}
	return flags
}

// greedyTokens is a greedy chat's tokens (their bytes, from the logprobs) and its text.
type greedyTokens struct {
	tokens  []string
	content string
}

func greedyBody(prompt string, maxTokens int, stream bool) map[string]any {
	b := chatBody(prompt, maxTokens, stream)
	b["logprobs"] = true
	return b
}

func tokenBytes(lps []runnerapi.TokenLogprob) []string {
	var out []string
	for _, lp := range lps {
		b := make([]byte, len(lp.Bytes))
		for i, c := range lp.Bytes {
			b[i] = byte(c)
		}
		out = append(out, string(b))
	}
	return out
}

func greedyWhole(t *testing.T, r *runner, prompt string, maxTokens int) greedyTokens {
	t.Helper()
	c := chatWhole(t, r, greedyBody(prompt, maxTokens, false))
	if len(c.Choices) != 1 || c.Choices[0].Logprobs == nil {
		t.Fatalf("chat %+v: want one choice with logprobs", c)
	}
	g := greedyTokens{tokens: tokenBytes(c.Choices[0].Logprobs.Content)}
	if c.Choices[0].Message.Content != nil {
		g.content = *c.Choices[0].Message.Content
	}
	return g
}

func greedyStream(t *testing.T, r *runner, prompt string, maxTokens int) greedyTokens {
	t.Helper()
	var g greedyTokens
	chunks, content, done, errEv := streamChat(t, r, context.Background(), greedyBody(prompt, maxTokens, true), nil)
	if !done || errEv != nil {
		t.Fatalf("stream ended without [DONE] (error %+v)", errEv)
	}
	for _, c := range chunks {
		for _, ch := range c.Choices {
			if ch.Logprobs != nil {
				g.tokens = append(g.tokens, tokenBytes(ch.Logprobs.Content)...)
			}
		}
	}
	g.content = content
	return g
}

// toolReply is the answer to chat_test's tool conversation, as JSON.
func toolReply(t *testing.T, r *runner) string {
	t.Helper()
	c := chatWhole(t, r, toolConversation)
	if len(c.Choices) != 1 || c.Usage == nil || c.Usage.CompletionTokens == 0 {
		t.Fatalf("tool conversation: %+v", c)
	}
	b, err := json.Marshal(c.Choices[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func sameTokens(t *testing.T, what string, got, want greedyTokens) {
	t.Helper()
	if len(want.tokens) < 8 {
		t.Fatalf("%s: the one-process reference produced only %d tokens", what, len(want.tokens))
	}
	for i := range max(len(got.tokens), len(want.tokens)) {
		if i >= len(got.tokens) || i >= len(want.tokens) || got.tokens[i] != want.tokens[i] {
			t.Fatalf("%s: token %d differs: split %q, one process %q\nsplit: %q\none process: %q", what, i,
				got.tokens[min(i, len(got.tokens)-1)], want.tokens[min(i, len(want.tokens)-1)], got.content, want.content)
		}
	}
	if got.content != want.content {
		t.Fatalf("%s: same tokens, different text: %q vs %q", what, got.content, want.content)
	}
}

// TestSplitModelMatchesOneProcess: a model split across a runner and one worker
// (three layers each), and across a runner and two workers (two layers each), answers
// token for token as the same model in one process, whole, streamed and with tools;
// the workers read the weights from their own files, and the links carry activations
// and graphs.
func TestSplitModelMatchesOneProcess(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	prompts := []string{"Tell me a story about the sea.", "List three prime numbers and explain why."}
	const maxTokens = 40
	one := startReady(t, m)
	want, wantStream := greedyReference(t, one, prompts, maxTokens)
	sameTokens(t, "one process streamed", wantStream, want[0])
	// A conversation with tools, a tool call and its result, rendered by the model's
	// own template.
	wantTool := toolReply(t, one)
	one.stop()

	for _, tc := range []struct {
		name          string
		layers, first []int
	}{{"two processes", []int{3}, []int{3}}, {"three processes", []int{2, 2}, []int{2, 4}}} {
		t.Run(tc.name, func(t *testing.T) {
			var workers []*worker
			for range tc.layers {
				workers = append(workers, startWorker(t, m))
			}
			r := startReady(t, m, splitFlags(workers, tc.layers...)...)
			loaded := r.status()
			for i, ws := range loaded.Split {
				// The worker holds its layers' weights and KV cache: at least the
				// weights, and for 8192 cells of f16 keys and values (32 wide) per layer.
				if least := int64(tc.layers[i] * (splitLayerBytes + 8192*2*32*2)); ws.AllocatedBytes < least {
					t.Errorf("split worker %d holds %d bytes of buffers, want at least %d", i, ws.AllocatedBytes, least)
				}
				// Started without --memory, it answers its Mac's physical memory.
				if ws.MemoryBytes < ws.AllocatedBytes {
					t.Errorf("split worker %d answered %d bytes of memory, less than the %d its buffers hold", i, ws.MemoryBytes, ws.AllocatedBytes)
				}
				// The weights stayed home: loading sent each worker a name, a size and a
				// hash per tensor, not its layers' F16 weights.
				if weights := uint64(tc.layers[i] * splitLayerBytes); ws.BytesSent >= weights/4 {
					t.Errorf("loading sent split worker %d %d bytes; its layers' weights are %d bytes", i, ws.BytesSent, weights)
				}
			}
			for i, p := range prompts {
				sameTokens(t, p, greedyWhole(t, r, p, maxTokens), want[i])
			}
			sameTokens(t, "streamed", greedyStream(t, r, prompts[0], maxTokens), want[0])
			if got := toolReply(t, r); got != wantTool {
				t.Errorf("the tool conversation's answer: split %s, one process %s", got, wantTool)
			}
			st := r.status()
			t.Logf("after load %+v; after %d requests %+v", loaded.Split, len(prompts)+1, st.Split)
			if len(st.Split) != len(workers) {
				t.Fatalf("status lists %d split workers, want %d: %+v", len(st.Split), len(workers), st.Split)
			}
			for i, ws := range st.Split {
				if ws.Addr != workers[i].addr || ws.Layers != tc.layers[i] || ws.FirstLayer != tc.first[i] || ws.Error != "" || ws.Computes == 0 ||
					ws.WorkerComputeSeconds <= 0 || ws.LinkWaitSeconds < ws.WorkerComputeSeconds {
					t.Errorf("split worker %d: %+v", i, ws)
				}
			}
		})
	}
}

// TestSplitModelWorkerFileDiffers: a worker whose copy of the model differs refuses the
// load with an error naming what differs — a tensor's bytes (same metadata, other
// weights), or the file itself (other metadata) at the greeting — and the runner
// fails its load (health failed, exit code 3).
func TestSplitModelWorkerFileDiffers(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	for _, tc := range []struct {
		name, workerModel string
		want              []string
	}{
		{"other weights", specModel(t, "split-seed4", splitSpec(4)), []string{"tensor blk.", "the worker's file differs"}},
		{"other metadata", specModel(t, "split-seed3-2layers", func() (ggufsynth.Spec, error) {
			s, err := splitSpec(3)()
			s.Layers = 2
			return s, err
		}), []string{"the worker's model file differs from the runner's"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := startWorker(t, tc.workerModel)
			r := startRunner(t, m, splitFlags([]*worker{w}, 3)...)
			checkLoadFails(t, r, tc.want...)
		})
	}
}

// TestSplitModelWorkerKilled: kill -9 of the worker in the middle of a stream ends the
// request with an error within 5 s; the runner then reports the lost worker on /status
// and /health (failed), refuses new requests, and exits with code 4, so the agent takes
// it out of service as a runner that died.
func TestSplitModelWorkerKilled(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	w := startWorker(t, m)
	r := startReady(t, m, splitFlags([]*worker{w}, 3)...)
	killMidStream(t, r, w)

	// The runner lingers (at most 2 s) until /health has reported the failure: status
	// and a new request first.
	st := r.status()
	if len(st.Split) != 1 || st.Split[0].Error == "" {
		t.Errorf("status split %+v, want the lost worker's error", st.Split)
	}
	var eb runnerapi.ErrorBody
	if code := r.postJSON("/v1/chat/completions", chatBody("Hello", 4, false), &eb); code != http.StatusServiceUnavailable ||
		eb.Error.Code != runnerapi.CodeSplitWorkerLost {
		t.Errorf("a new request after the kill: %d %+v, want 503 %s", code, eb, runnerapi.CodeSplitWorkerLost)
	}
	var h runnerapi.Health
	code, err := r.getJSON("/health", &h)
	if err != nil || code != http.StatusServiceUnavailable || h.Status != runnerapi.StateFailed || !strings.Contains(h.Error, w.addr) {
		t.Errorf("health after the kill: %d %+v %v, want 503 failed naming %s", code, h, err, w.addr)
	}
	// Then it exits, as a runner that died: the agent takes the replica out of service.
	if code := r.exitCode(10 * time.Second); code != 4 {
		t.Errorf("exit code %d, want 4 (a split worker is lost)", code)
	}
}

// TestSplitModelWorkerStopsOnSIGTERM: SIGTERM to a worker in the middle of a stream
// ends its session at once — the worker exits 0 well within the 2 s the pool waits
// after SIGTERM before SIGKILL (runnerproc's KillAfter) — and the runner ends the
// request with a split_worker_lost error event, never hanging it.
func TestSplitModelWorkerStopsOnSIGTERM(t *testing.T) {
	const exitBound = time.Second
	m := specModel(t, "split-seed3", splitSpec(3))
	w := startWorker(t, m)
	r := startReady(t, m, splitFlags([]*worker{w}, 3)...)
	var (
		termed time.Time
		exited time.Duration // how long the worker took to exit; 0: not within exitBound
	)
	chunks, _, done, errEv := streamChat(t, r, context.Background(), chatBody("Tell me a very long story about the sea.", 4000, true), func(c chunk) bool {
		if !termed.IsZero() || len(c.Choices) == 0 || c.Choices[0].Delta.Content == nil {
			return true
		}
		if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		termed = time.Now()
		select {
		case <-w.exited:
			exited = time.Since(termed)
		case <-time.After(exitBound):
			// Today's worker would be SIGKILLed by the pool now; so is this one, to end
			// the stream.
			t.Errorf("the worker did not exit within %v of SIGTERM while serving; stderr:\n%s", exitBound, tail(w.stderr.String(), 2000))
			_ = w.cmd.Process.Kill()
		}
		return true
	})
	took := time.Since(termed)
	if termed.IsZero() || done {
		t.Fatalf("the stream finished (%d chunks, done %v) before the worker was stopped", len(chunks), done)
	}
	if exited > 0 {
		if code := w.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("the worker exited with %d after SIGTERM, want 0", code)
		}
		if !strings.Contains(w.stderr.String(), "ended the session with the runner") {
			t.Errorf("the worker's stderr does not say it ended the session:\n%s", tail(w.stderr.String(), 2000))
		}
	}
	if took > 5*time.Second {
		t.Errorf("the stream ended %v after SIGTERM, want within 5s", took)
	}
	if errEv == nil || errEv.Error.Code != runnerapi.CodeSplitWorkerLost {
		t.Fatalf("the stream ended with %+v, want a %s error event", errEv, runnerapi.CodeSplitWorkerLost)
	}
	t.Logf("the worker exited %v after SIGTERM (0: SIGKILLed); the stream ended %v after SIGTERM: %s",
		exited.Round(time.Millisecond), took.Round(time.Millisecond), errEv.Error.Message)
	// The runner then exits as one whose worker is lost.
	if code := r.exitCode(10 * time.Second); code != 4 {
		t.Errorf("the runner's exit code %d, want 4 (a split worker is lost)", code)
	}
}

// TestSplitModelWorkerHangs: a worker that stops answering (SIGSTOP: its socket stays
// open, as on a cut link that sends no reset) fails the request once --split-timeout
// passes, never hanging it.
func TestSplitModelWorkerHangs(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	w := startWorker(t, m)
	r := startReadyShortLinks(t, m, append(splitFlags([]*worker{w}, 3), "--split-timeout", "1s")...)
	took, errEv := signalMidStream(t, r, w, syscall.SIGSTOP)
	if !strings.Contains(errEv.Error.Message, "no answer within") {
		t.Fatalf("the stream ended with %+v, want an error for the timeout", errEv)
	}
	if took < time.Second || took > 5*time.Second {
		t.Errorf("the stream ended %v after the worker stopped, want after the 1s timeout and within 5s", took)
	}
	t.Logf("the stream ended %v after the worker stopped: %s", took.Round(time.Millisecond), errEv.Error.Message)
}

// TestSplitModelPromptCache: the prompt cache works on a split model — a conversation's
// state, saved from the worker's KV cache into the runner's hot tier after turn 1 and
// pushed out of the only slot by another conversation, is restored into the worker for
// turn 2 — and the split answers every turn as one process doing the same does.
func TestSplitModelPromptCache(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	conv := &conversation{users: []string{words(1, 200), words(2, 100)}}
	other := []chatMsg{{"role": "user", "content": words(3, 150)}}
	flags := []string{"--prompt-cache-block", fmt.Sprint(pcBlock), "--prompt-cache-hot-bytes", fmt.Sprint(256 << 20)}
	// turns runs turn 1, the other conversation and turn 2, and returns the replies and
	// the tokens turn 2 restored.
	turns := func(r *runner) ([]string, int) {
		var replies []string
		reply, _ := chatTurn(t, r, conv.messages(0), pcMaxTokens)
		conv.replies = append(conv.replies[:0], reply)
		replies = append(replies, reply)
		reply, _ = chatTurn(t, r, other, pcMaxTokens)
		replies = append(replies, reply)
		reply, u := chatTurn(t, r, conv.messages(1), pcMaxTokens)
		return append(replies, reply), cachedTokens(u)
	}
	one := startReady(t, m, flags...)
	want, wantRestored := turns(one)
	one.stop()

	w := startWorker(t, m)
	r := startReady(t, m, append(splitFlags([]*worker{w}, 3), flags...)...)
	got, restored := turns(r)
	if restored == 0 || restored != wantRestored {
		t.Errorf("turn 2 restored %d tokens from the prompt cache, one process %d (cache %+v)", restored, wantRestored, promptCacheStatus(t, r))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("reply %d: split %q, one process %q", i, got[i], want[i])
		}
	}
	t.Logf("turn 2 restored %d tokens; replies %q", restored, got)
}

// TestSplitWorkerServesRunnersInTurn: a worker refuses a stranger speaking another
// protocol version and keeps serving; when its runner goes away it serves the next one
// (the same answer again).
func TestSplitWorkerServesRunnersInTurn(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	w := startWorker(t, m)

	conn, err := net.DialTimeout("tcp", w.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A greeting of protocol version 99: u32 length, the HELLO command, then magic,
	// version, pointer size, byte order, file size and header hash.
	hello := binary.LittleEndian.AppendUint32(nil, 32)
	hello = append(hello, 1)
	for _, v := range []uint32{0x444e464d, 99, 8, 0x01020304} {
		hello = binary.LittleEndian.AppendUint32(hello, v)
	}
	hello = append(hello, make([]byte, 16)...)
	if _, err := conn.Write(hello); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, err := io.ReadAll(conn)
	conn.Close()
	if err != nil || len(answer) < 5 || answer[4] != 1 || !strings.Contains(string(answer[5:]), "protocol version 99") {
		t.Fatalf("the worker answered a version-99 greeting with %q (%v), want an error naming the version", answer, err)
	}

	var first []greedyTokens
	for i := range 2 {
		r := startReady(t, m, splitFlags([]*worker{w}, 3)...)
		first = append(first, greedyWhole(t, r, "Tell me a story about the sea.", 16))
		r.stop()
		if code := r.exitCode(10 * time.Second); code != 0 {
			t.Fatalf("runner %d exited with %d", i, code)
		}
	}
	sameTokens(t, "the second runner", first[1], first[0])
	waitFor(t, 10*time.Second, "the worker to log both runners' ends", func() bool {
		return strings.Count(w.stderr.String(), "disconnected") == 2
	})
}

// TestSplitModelWorkerUnreachable: a runner whose worker does not answer fails its load
// with the worker's address and the reason (exit code 3).
func TestSplitModelWorkerUnreachable(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	r := startRunner(t, m, "--split-worker", addr, "--split-layers", "3")
	var h runnerapi.Health
	waitFor(t, 30*time.Second, "the load to fail", func() bool {
		_, err := r.getJSON("/health", &h)
		return err == nil && h.Status == runnerapi.StateFailed
	})
	if !strings.Contains(h.Error, "split worker "+addr) || !strings.Contains(h.Error, "refused") {
		t.Errorf("health error %q, want the worker's address and the refused connection", h.Error)
	}
	if code := r.exitCode(10 * time.Second); code != 3 {
		t.Errorf("exit code %d, want 3 (load failed)", code)
	}
}

// killMidStream kills w with SIGKILL once r streams content and checks that the stream
// ends within 5 s with a split_worker_lost error event.
func killMidStream(t *testing.T, r *runner, w *worker) {
	t.Helper()
	took, errEv := signalMidStream(t, r, w, syscall.SIGKILL)
	if took > 5*time.Second {
		t.Errorf("the stream ended %v after the kill, want within 5s", took)
	}
	t.Logf("the stream ended %v after the kill: %s", took.Round(time.Millisecond), errEv.Error.Message)
}

// signalMidStream sends w sig once r streams content (a SIGSTOP is undone at the test's
// end), checks that the stream then ends with a split_worker_lost error event, and
// returns how long after the signal it ended, and the event.
func signalMidStream(t *testing.T, r *runner, w *worker, sig syscall.Signal) (time.Duration, *runnerapi.ErrorBody) {
	t.Helper()
	if sig == syscall.SIGSTOP {
		t.Cleanup(func() { _ = w.cmd.Process.Signal(syscall.SIGCONT) })
	}
	var sent time.Time
	chunks, _, done, errEv := streamChat(t, r, context.Background(), chatBody("Tell me a very long story about the sea.", 4000, true), func(c chunk) bool {
		if sent.IsZero() && len(c.Choices) > 0 && c.Choices[0].Delta.Content != nil {
			if err := w.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			sent = time.Now()
		}
		return true
	})
	took := time.Since(sent)
	if sent.IsZero() || done {
		t.Fatalf("the stream finished (%d chunks, done %v) before the worker got %v", len(chunks), done, sig)
	}
	if errEv == nil || errEv.Error.Code != runnerapi.CodeSplitWorkerLost {
		t.Fatalf("the stream ended with %+v, want a %s error event", errEv, runnerapi.CodeSplitWorkerLost)
	}
	return took, errEv
}

// checkLoadFails waits until r's /health says its load failed, checks that the error
// says each of want, and that r exits with code 3.
func checkLoadFails(t *testing.T, r *runner, want ...string) {
	t.Helper()
	var h runnerapi.Health
	waitFor(t, 30*time.Second, "the load to fail", func() bool {
		_, err := r.getJSON("/health", &h)
		return err == nil && h.Status == runnerapi.StateFailed
	})
	t.Logf("health error: %s", h.Error)
	for _, w := range want {
		if !strings.Contains(h.Error, w) {
			t.Errorf("health error %q does not say %q", h.Error, w)
		}
	}
	if code := r.exitCode(10 * time.Second); code != 3 {
		t.Errorf("exit code %d, want 3 (load failed)", code)
	}
}

// greedyReference is what one answers greedily to each prompt, whole, and to the first,
// streamed.
func greedyReference(t *testing.T, one *runner, prompts []string, maxTokens int) (want []greedyTokens, stream greedyTokens) {
	t.Helper()
	for _, p := range prompts {
		want = append(want, greedyWhole(t, one, p, maxTokens))
	}
	return want, greedyStream(t, one, prompts[0], maxTokens)
}

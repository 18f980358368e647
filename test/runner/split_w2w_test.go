package e2e

import (
	"crypto/rand"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// splitHiddenBytes is one token's hidden state in splitSpec's model: 64 floats.
const splitHiddenBytes = 64 * 4

// startChain starts the workers of a split, last first, each but the last with --next
// the following one's address (worker to worker).
func startChain(t testing.TB, modelPath string, n int) []*worker {
	t.Helper()
	workers := make([]*worker, n)
	for i := n - 1; i >= 0; i-- {
		var extra []string
		if i+1 < n {
			extra = []string{"--next", workers[i+1].addr}
		}
		workers[i] = startWorker(t, modelPath, extra...)
	}
	return workers
}

// TestSplitModelWorkerToWorker: a model split across a runner and two workers, the
// first started with --next the second, answers token for token as one process —
// whole, streamed and with tools — while the hidden state between the workers no
// longer passes through the runner: per generated token the runner receives less
// than one hidden state from the first worker (it received one per step before), and
// the first worker's pushes to the second grow by at least one per token.
func TestSplitModelWorkerToWorker(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	prompts := []string{"Tell me a story about the sea.", "List three prime numbers and explain why."}
	const maxTokens = 40
	one := startReady(t, m)
	want, wantStream := greedyReference(t, one, prompts, maxTokens)
	wantTool := toolReply(t, one)
	one.stop()

	workers := startChain(t, m, 2)
	r := startReady(t, m, splitFlags(workers, 2, 2)...)
	if st := r.status(); len(st.Split) != 2 || !st.Split[0].PeerLink || st.Split[1].PeerLink {
		t.Fatalf("status split %+v: want the first worker's peer link up, the second without one", st.Split)
	}
	for i, p := range prompts {
		before := r.status().Split
		got := greedyWhole(t, r, p, maxTokens)
		sameTokens(t, p, got, want[i])
		after := r.status().Split
		tokens := uint64(len(got.tokens))
		recv := (after[0].BytesReceived - before[0].BytesReceived) / tokens
		peer := (after[0].PeerBytesSent - before[0].PeerBytesSent) / tokens
		t.Logf("%q: %d tokens; per token the runner received %d bytes from the first worker, which pushed %d bytes to the second",
			p, tokens, recv, peer)
		if recv >= splitHiddenBytes {
			t.Errorf("the runner received %d bytes per token from the first worker, at least a hidden state (%d): it still relays it",
				recv, splitHiddenBytes)
		}
		// The pushes are counted with the next answer: one step's may still be pending.
		if after[0].PeerBytesSent-before[0].PeerBytesSent < (tokens-1)*splitHiddenBytes {
			t.Errorf("the first worker pushed %d bytes over %d tokens, want at least a hidden state per token",
				after[0].PeerBytesSent-before[0].PeerBytesSent, tokens)
		}
	}
	sameTokens(t, "streamed", greedyStream(t, r, prompts[0], maxTokens), wantStream)
	if got := toolReply(t, r); got != wantTool {
		t.Errorf("the tool conversation's answer: split %s, one process %s", got, wantTool)
	}
	for i, ws := range r.status().Split {
		if ws.Error != "" || ws.Computes == 0 || ws.WorkerComputeSeconds <= 0 {
			t.Errorf("split worker %d: %+v", i, ws)
		}
	}
}

// TestSplitModelWorkerToWorkerPipelined: worker to worker on a pipelined runner (two
// contexts, each with its own graph stream and pushes on the one peer link) answers
// four concurrent greedy chats token for token as one process with four slots.
func TestSplitModelWorkerToWorkerPipelined(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	const maxTokens = 40
	one := startReady(t, m, "--parallel", "4")
	want := greedyAtOnce(t, one, pipelinePrompts, maxTokens)
	one.stop()

	workers := startChain(t, m, 2)
	r := startReady(t, m, append(splitFlags(workers, 2, 2), "--parallel", "4", "--split-pipeline", "2")...)
	for range 3 {
		got := greedyAtOnce(t, r, pipelinePrompts, maxTokens)
		for i, p := range pipelinePrompts {
			sameTokens(t, p, got[i], want[i])
		}
	}
	st := r.status()
	t.Logf("split %+v", st.Split)
	if !st.Split[0].PeerLink || st.Split[0].PeerBytesSent == 0 {
		t.Errorf("the first worker pushed nothing: %+v", st.Split[0])
	}
}

// TestSplitModelWorkerToWorkerKilled: with the hidden state going from worker to
// worker, kill -9 of either worker in the middle of a stream ends the request with a
// split_worker_lost error within 5 s: the second (the first worker's push fails and
// the runner's link to it ends), or the first (the second's await sees its peer link
// close).
func TestSplitModelWorkerToWorkerKilled(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	for _, tc := range []struct {
		name   string
		killed int
	}{{"the second worker", 1}, {"the first worker", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			workers := startChain(t, m, 2)
			r := startReady(t, m, splitFlags(workers, 2, 2)...)
			killMidStream(t, r, workers[tc.killed])
			if code := r.exitCode(10 * time.Second); code != 4 {
				t.Errorf("exit code %d, want 4 (a split worker is lost)", code)
			}
		})
	}
}

// TestSplitWorkerRefusesAStrangersPeerLink: a worker accepts a peer link only with the
// session id its current runner gave it. A connection presenting another id is
// refused with the reason; and a runner whose first worker's --next reaches a worker
// serving another runner fails its load saying so (exit code 3), as does one whose last
// worker has a --next (nothing follows it: the flag is not passed over).
func TestSplitWorkerRefusesAStrangersPeerLink(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	// A worker serving a runner of its own.
	other := startWorker(t, m)
	startReady(t, m, splitFlags([]*worker{other}, 3)...)

	t.Run("a wrong session id", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", other.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// A peer greeting as the agents check it on a peer link (runnerapi): u32 length,
		// the command, a session id. A worker whose protocol disagreed would take it
		// for a runner's session, not refuse its session id.
		frame := binary.LittleEndian.AppendUint32(nil, runnerapi.SplitPeerSessionBytes)
		frame = append(frame, runnerapi.SplitPeerHello)
		session := make([]byte, runnerapi.SplitPeerSessionBytes)
		_, _ = rand.Read(session)
		if _, err := conn.Write(append(frame, session...)); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		answer, err := io.ReadAll(conn)
		if err != nil || len(answer) < 5 || answer[4] != 1 || !strings.Contains(string(answer[5:]), "session id is not the one this worker's runner gave it") {
			t.Fatalf("the worker answered a stranger's peer greeting with %q (%v), want a refusal naming the session id", answer, err)
		}
		t.Logf("refused: %s", answer[5:])
		waitFor(t, 5*time.Second, "the worker to log the refusal", func() bool {
			return strings.Contains(other.stderr.String(), "refused: its session id")
		})
	})

	t.Run("a --next reaching another runner's worker", func(t *testing.T) {
		first := startWorker(t, m, "--next", other.addr)
		second := startWorker(t, m)
		r := startRunner(t, m, splitFlags([]*worker{first, second}, 2, 2)...)
		checkLoadFails(t, r, "split worker "+first.addr, "the next worker at "+other.addr, "refused the peer link", "session id")
	})

	t.Run("a --next on the last worker", func(t *testing.T) {
		last := startWorker(t, m, "--next", other.addr)
		r := startRunner(t, m, splitFlags([]*worker{last}, 3)...)
		checkLoadFails(t, r, "split worker "+last.addr+" was started with --next", "no worker follows it")
	})
}

// TestSplitModelWorkerToWorkerHangs: the first worker stops (SIGSTOP: its sockets stay
// open) in the middle of a stream with worker to worker: the second worker's await and
// the runner's wait are both bounded by --split-timeout, so the request fails after it
// instead of hanging — after one timeout, not one per worker (once a link has failed,
// the runner waits on no other).
func TestSplitModelWorkerToWorkerHangs(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	workers := startChain(t, m, 2)
	r := startReadyShortLinks(t, m, append(splitFlags(workers, 2, 2), "--split-timeout", "1s")...)
	took, errEv := signalMidStream(t, r, workers[0], syscall.SIGSTOP)
	if took < time.Second || took > 1900*time.Millisecond {
		t.Errorf("the stream ended %v after the worker stopped, want after the 1s timeout and before a second one", took)
	}
	t.Logf("the stream ended %v after the first worker stopped: %s", took.Round(time.Millisecond), errEv.Error.Message)
}

package e2e

import (
	"crypto/rand"
	"encoding/binary"
	"strings"
	"testing"
	"time"
)

// TestAttackSplitWorkerHeldByFrames: a process holding the secret holds the worker
// with frames it never finishes. On main a greeting's frame could claim 2 GiB, which
// the worker allocated (and zeroed) before reading a byte of it, and a greeting cut
// short held the worker forever: it serves one runner at a time, so no honest runner
// was served again. Now a greeting's frame above 4 KiB and any later frame above the
// largest transfer (1 GiB) are answered with an error at once, and a greeting that
// does not arrive whole within 10 s ends the connection, after which an honest
// session is served. Without the secret each is closed unanswered.
func TestAttackSplitWorkerHeldByFrames(t *testing.T) {
	w := startAttackWorker(t)
	// A greeting claiming 100 MiB: refused at its header.
	c := w.dial(t, true, []byte{0, 0, 0x40, 0x06, wireHello})
	c.refused("a greeting of 100 MiB", "above the 4096 allowed")
	// After the greeting, a SET claiming 1.5 GiB.
	c, _ = w.session(t, make([]byte, 16))
	c.send([]byte{0, 0, 0, 0x60, wireSet})
	c.refused("a frame of 1.5 GiB", "allowed here")
	c.conn.Close()

	// A greeting cut short: its header and 10 of its 56 bytes.
	start := time.Now()
	stuck := w.dial(t, true, wireFrame(wireHello, wireGreeting(t, w.model, make([]byte, 16)))[:15])
	honest, _ := w.session(t, make([]byte, 16))
	if waited := time.Since(start); waited > 25*time.Second {
		t.Errorf("an honest session waited %v behind a greeting cut short", waited)
	}
	stuck.refused("a greeting cut short", "no greeting within")
	honest.send(wireFrame(wireStatus))
	if status, p := honest.read(10 * time.Second); status != 0 {
		t.Errorf("the honest session's STATUS: %d %q", status, p)
	}
	honest.conn.Close()
	for _, f := range [][]byte{{0, 0, 0x40, 0x06, wireHello}, {0, 0, 0, 0x60, wireSet}} {
		w.withoutSecret(t, f)
	}
	w.alive(t, "the frames")
}

// TestAttackSplitWorkerIdles: a process holding the secret greets the worker and then
// sends nothing. On main the session never ended: the worker, serving one runner at a
// time, was held for as long as the connection stayed open. Now a session ends after
// --idle-timeout without a command (answered with an error naming it), while an honest
// runner idle far longer keeps its session: its device sends a STATUS a third of the
// way (the runner learns the timeout from the greeting's answer).
func TestAttackSplitWorkerIdles(t *testing.T) {
	w := startAttackWorker(t, "--idle-timeout", "2s")
	c, reply := w.session(t, make([]byte, 16))
	if idle := binary.LittleEndian.Uint32(reply[48:]); idle != 2000 {
		t.Errorf("the greeting's answer gives an idle timeout of %d ms, want 2000", idle)
	}
	start := time.Now()
	c.refused("an idle session", "idle for 2s")
	if took := time.Since(start); took < 2*time.Second || took > 20*time.Second {
		t.Errorf("the idle session ended after %v, want about 2s", took)
	}
	w.withoutSecret(t)

	fwd := &worker{addr: authForward(t, w.addr, w.secret)}
	r := startReady(t, w.model, splitFlags([]*worker{fwd}, 3)...)
	first := greedyWhole(t, r, "Say hi", 4)
	// Idle: the round trips counted meanwhile are the device's keepalives, one a
	// third of the timeout; five of them span more than a whole timeout.
	before := r.status().Split[0].RoundTrips
	idleFrom := time.Now()
	waitFor(t, 60*time.Second, "five keepalives on the idle link", func() bool { return r.status().Split[0].RoundTrips-before >= 5 })
	if idled := time.Since(idleFrom); idled < 2*time.Second {
		t.Errorf("five keepalives within %v: more often than a third of the 2s timeout", idled)
	}
	if again := greedyWhole(t, r, "Say hi", 4); strings.Join(again.tokens, "") != strings.Join(first.tokens, "") {
		t.Errorf("after idling the runner answered %q, before %q", again.content, first.content)
	}
	if strings.Count(w.stderr.String(), "idle for") != 1 {
		t.Errorf("the honest runner's session idled out:\n%s", tail(w.stderr.String(), 2000))
	}
	w.alive(t, "the idle sessions")
}

// TestAttackSplitWorkerStash: a process holding the secret and a session's id (the
// runner that gave it, or a previous worker) opens the peer link and pushes sequence
// numbers no await asks for. On main the worker kept every one (its stash had no
// bound: a Mac's memory for the asking). Now an await that finds 64 unclaimed pushes
// fails with an error naming them, and the session's next answer reports it.
func TestAttackSplitWorkerStash(t *testing.T) {
	w := startAttackWorker(t)
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	c, _ := w.session(t, id)
	base := c.alloc(4096)
	peer := w.dial(t, true, wireFrame(wirePeerHelo, id))
	if status, p := peer.read(10 * time.Second); status != 0 {
		t.Fatalf("the peer greeting with the session's id was refused: %d %q", status, p)
	}
	var pushes []byte
	for seq := uint64(1000); seq < 1100; seq++ {
		pushes = append(pushes, wireFrame(0, u64s(seq, 0x4141414141414141))...)
	}
	peer.send(pushes, wireFrame(0, u64s(1, 0x4242424242424242)))
	c.send(wireFrame(wireAwait, u64s(1, base, 8)), wireFrame(wireStatus))
	c.refused("100 pushes nobody awaits", "no await asked for")
	c.conn.Close()
	w.withoutSecret(t, wireFrame(wireAwait, u64s(1, base, 8)))
	w.alive(t, "the pushes")
}

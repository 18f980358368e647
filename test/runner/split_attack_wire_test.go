package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufheader"
)

// The worker protocol as an attacker speaks it (metal/runner/netdevice/wire.h): a
// process holding a worker's secret (or not) that connects to its port and sends it
// frames of its own making, not a runner's.
const (
	wireHello    = 1
	wireAlloc    = 2
	wireFree     = 3
	wireSet      = 5
	wireGet      = 7
	wireCompute  = 10
	wireStatus   = 11
	wireAwait    = 13
	wirePeerHelo = 14

	wireMagic      = 0x444e464d
	wireVersion    = 7
	wireTensorSize = 256 // mfnd_tensor
	wireReplySize  = 120 // mfnd_hello_reply
)

// wireHash is wire.h's mfnd_hash, with which a greeting names the model file.
func wireHash(b []byte) uint64 {
	h := 0x9e3779b97f4a7c15 ^ uint64(len(b))
	i := 0
	for ; i+8 <= len(b); i += 8 {
		h = (h ^ binary.LittleEndian.Uint64(b[i:])) * 0x100000001b3
		h ^= h >> 31
	}
	for ; i < len(b); i++ {
		h = (h ^ uint64(b[i])) * 0x100000001b3
	}
	h ^= h >> 29
	return h * 0xbf58476d1ce4e5b9
}

// wireGreeting is the HELLO payload a runner of modelPath sends: the file's size and
// the hash of its header (through the tensor table, padded to GGUF's alignment of 32),
// with session as the session's id.
func wireGreeting(t testing.TB, modelPath string, session []byte) []byte {
	t.Helper()
	data, err := os.ReadFile(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	n, err := ggufheader.Scan(bytes.NewReader(data), ggufheader.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	n = (n + 31) / 32 * 32
	h := make([]byte, 56)
	binary.LittleEndian.PutUint32(h[0:], wireMagic)
	binary.LittleEndian.PutUint32(h[4:], wireVersion)
	binary.LittleEndian.PutUint32(h[8:], 8)
	binary.LittleEndian.PutUint32(h[12:], 0x01020304)
	binary.LittleEndian.PutUint64(h[16:], uint64(len(data)))
	binary.LittleEndian.PutUint64(h[24:], wireHash(data[:n]))
	copy(h[32:48], session)
	binary.LittleEndian.PutUint32(h[48:], 10000)
	return h
}

// wireFrame is one frame: u32 payload length, command, payload.
func wireFrame(cmd byte, payload ...[]byte) []byte {
	p := bytes.Join(payload, nil)
	return append(append(binary.LittleEndian.AppendUint32(nil, uint32(len(p))), cmd), p...)
}

// u64s is the little-endian bytes of vs.
func u64s(vs ...uint64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

// attackWorker is a worker started with a secret, as the agent starts it, and what an
// attacker needs to speak to it: its model file and the secret (an attacker that has
// it: the head Mac's runner, or anything that took it).
type attackWorker struct {
	*worker
	model  string
	secret []byte
}

func startAttackWorker(t testing.TB, flags ...string) *attackWorker {
	t.Helper()
	m := specModel(t, "split-seed3", splitSpec(3))
	secret := make([]byte, runnerapi.SplitSecretBytes)
	_, _ = rand.Read(secret)
	w := startWorkerStdin(t, hex.EncodeToString(secret)+"\n", m, append([]string{"--secret-stdin"}, flags...)...)
	return &attackWorker{worker: w, model: m, secret: secret}
}

// wireConn is an attacker's connection to a worker.
type wireConn struct {
	t    testing.TB
	conn net.Conn
}

// dial connects, presents the secret when withSecret, and sends first.
func (w *attackWorker) dial(t testing.TB, withSecret bool, first []byte) *wireConn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", w.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if withSecret {
		first = append(runnerapi.SplitAuthFrame(w.secret), first...)
	}
	if _, err := conn.Write(first); err != nil {
		t.Fatal(err)
	}
	return &wireConn{t: t, conn: conn}
}

// session opens a greeted session (with the secret) with the given session id: it
// returns the connection and the worker's greeting answer.
func (w *attackWorker) session(t testing.TB, id []byte) (*wireConn, []byte) {
	t.Helper()
	c := w.dial(t, true, wireFrame(wireHello, wireGreeting(t, w.model, id)))
	status, reply := c.read(30 * time.Second)
	if status != 0 || len(reply) != wireReplySize {
		t.Fatalf("the worker refused an honest greeting: status %d, %q", status, reply)
	}
	return c, reply
}

// greets opens a greeted session and closes it: nil when the worker answered the
// greeting, else why not.
func (w *attackWorker) greets(t testing.TB) error {
	conn, err := net.DialTimeout("tcp", w.addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	hello := append(runnerapi.SplitAuthFrame(w.secret), wireFrame(wireHello, wireGreeting(t, w.model, make([]byte, 16)))...)
	if _, err := conn.Write(hello); err != nil {
		return err
	}
	c := &wireConn{t: t, conn: conn}
	if status, reply := c.read(30 * time.Second); status != 0 || len(reply) != wireReplySize {
		return fmt.Errorf("the greeting's answer: status %d, %q", status, reply)
	}
	return nil
}

func (c *wireConn) send(frames ...[]byte) {
	c.t.Helper()
	if _, err := c.conn.Write(bytes.Join(frames, nil)); err != nil {
		c.t.Fatalf("sending: %v", err)
	}
}

// read reads one answer: its status (0 ok, 1 error) and payload; status -1 when the
// worker closed the link (or sent nothing within timeout: -2).
func (c *wireConn) read(timeout time.Duration) (int, []byte) {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(timeout))
	head := make([]byte, 5)
	if _, err := io.ReadFull(c.conn, head); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return -2, nil
		}
		return -1, []byte(err.Error())
	}
	p := make([]byte, binary.LittleEndian.Uint32(head))
	if _, err := io.ReadFull(c.conn, p); err != nil {
		return -1, []byte(err.Error())
	}
	return int(head[4]), p
}

// refused reads the answer to an attack: an error answer whose message holds want.
func (c *wireConn) refused(what, want string) {
	c.t.Helper()
	status, p := c.read(30 * time.Second)
	if status != 1 || !strings.Contains(string(p), want) {
		c.t.Errorf("%s: the worker answered status %d (%q), want an error naming %q", what, status, tail(string(p), 300), want)
	}
}

// closed says whether the worker closed the link (EOF or reset) without a byte more
// within timeout.
func (c *wireConn) closed(timeout time.Duration) error {
	_ = c.conn.SetReadDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(c.conn)
	if len(b) != 0 {
		return fmt.Errorf("the worker answered %d bytes", len(b))
	}
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		return err
	}
	return nil
}

// alloc allocates a buffer of n bytes and returns its base.
func (c *wireConn) alloc(n uint64) uint64 {
	c.t.Helper()
	c.send(wireFrame(wireAlloc, u64s(n)))
	status, p := c.read(30 * time.Second)
	if status != 0 || len(p) != 8 {
		c.t.Fatalf("allocating %d bytes: status %d, %q", n, status, p)
	}
	return binary.LittleEndian.Uint64(p)
}

// alive fails the test if the worker process has exited (crashed).
func (w *attackWorker) alive(t testing.TB, after string) {
	t.Helper()
	select {
	case <-w.exited:
		t.Fatalf("after %s the worker exited (%v); stderr:\n%s", after, w.cmd.ProcessState, tail(w.stderr.String(), 3000))
	default:
	}
}

// withoutSecret sends frames to the worker without the secret: it must close the link
// without a byte of answer (the attacker that lacks the secret reaches nothing).
func (w *attackWorker) withoutSecret(t testing.TB, frames ...[]byte) {
	t.Helper()
	c := w.dial(t, false, append(wireFrame(wireHello, wireGreeting(t, w.model, make([]byte, 16))), bytes.Join(frames, nil)...))
	if err := c.closed(20 * time.Second); err != nil {
		t.Errorf("without the secret: %v, want the link closed without an answer", err)
	}
}

// servesAnHonestRunner checks that a runner reaching the worker through a forward
// that presents the secret (the agent's role) loads and answers.
func (w *attackWorker) servesAnHonestRunner(t *testing.T) {
	t.Helper()
	fwd := &worker{addr: authForward(t, w.addr, w.secret)}
	r := startReady(t, w.model, splitFlags([]*worker{fwd}, 3)...)
	if g := greedyWhole(t, r, "Say hi", 4); len(g.tokens) == 0 {
		t.Errorf("no tokens through the worker after the attacks")
	}
	r.stop()
	w.alive(t, "the honest runner")
}

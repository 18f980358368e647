package e2e

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/agent/splitlink"
	"github.com/macfleet/macfleet/api/runnerapi"
)

// authForward is a loopback forward to the worker at addr that authenticates each
// connection with secret, as the worker Mac's agent does on the split link
// (agent/splitlink) once it has checked the head Mac's certificate.
func authForward(t *testing.T, addr string, secret []byte) string {
	t.Helper()
	fwd, err := splitlink.Forward(func(ctx context.Context) (net.Conn, error) {
		return splitlink.DialWorker(ctx, splitlink.Worker{Addr: addr, Secret: secret}, 5*time.Second)
	}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	return fwd.Addr()
}

// TestAttackSplitWorkerWithoutTheSecret: a process of the worker's Mac (another
// tenant's runner, anything that can reach loopback) connects straight to a worker's
// port, bypassing the agent's split link and its certificate check, and greets it as a
// runner to load layers and compute on it. On main the worker answered the greeting
// and served the session. Now a worker started with a secret (as the agent starts
// every worker) closes any connection that does not open with it — a runner's
// greeting, a wrong secret, nothing within the timeout — without a byte of answer,
// while a runner reaching it through a forward that presents the secret (the agent's
// role) loads and answers. The secret comes on the worker's standard input
// (--secret-stdin), as the agent gives it.
func TestAttackSplitWorkerWithoutTheSecret(t *testing.T) {
	m := specModel(t, "split-seed3", splitSpec(3))
	secret := make([]byte, runnerapi.SplitSecretBytes)
	_, _ = rand.Read(secret)
	w := startWorkerStdin(t, hex.EncodeToString(secret)+"\n", m, "--secret-stdin")

	// A runner's greeting as the first frame: u32 length, HELLO, a 56-byte mfnd_hello.
	hello := binary.LittleEndian.AppendUint32(nil, 56)
	hello = append(append(hello, 1), make([]byte, 56)...)
	binary.LittleEndian.PutUint32(hello[5:], 0x444e464d) // "MFND"
	wrong := make([]byte, runnerapi.SplitSecretBytes)
	for _, tc := range []struct {
		name  string
		first []byte
	}{
		{"a runner's greeting", hello},
		{"a wrong secret", append(runnerapi.SplitAuthFrame(wrong), hello...)},
		{"a frame claiming 2 GiB", []byte{0, 0, 0, 0x80, 1}},
	} {
		conn, err := net.DialTimeout("tcp", w.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(tc.first); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		answer, err := io.ReadAll(conn)
		conn.Close()
		if len(answer) != 0 || (err != nil && !errors.Is(err, syscall.ECONNRESET)) {
			t.Errorf("%s: the worker answered %d bytes (%v), want the connection closed without a byte", tc.name, len(answer), err)
		}
	}
	waitFor(t, 5*time.Second, "the worker to log the refusals", func() bool {
		return strings.Count(w.stderr.String(), "refused the connection") == 3
	})
	if strings.Contains(w.stderr.String(), "serving the runner") {
		t.Errorf("the worker served an unauthenticated connection:\n%s", w.stderr.String())
	}

	// Through a forward that presents the secret, a runner loads and answers.
	fwd := &worker{addr: authForward(t, w.addr, secret)}
	r := startReady(t, m, splitFlags([]*worker{fwd}, 3)...)
	if g := greedyWhole(t, r, "Say hi", 4); len(g.tokens) == 0 {
		t.Errorf("no tokens through the authenticated worker")
	}
}

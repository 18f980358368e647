package clustermode

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// workerAgent stands in for the worker Mac's agent at the far end of the head's split
// links: a real TCP listener whose connections' bytes arrive on got.
type workerAgent struct {
	ln  net.Listener
	got chan []byte
}

func newWorkerAgent(t *testing.T) *workerAgent {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	w := &workerAgent{ln: ln, got: make(chan []byte, 8)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
				b, _ := io.ReadAll(c)
				w.got <- b
			}()
		}
	}()
	return w
}

func (w *workerAgent) dial(ctx context.Context, _, _, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", w.ln.Addr().String())
}

// send connects to addr as a local process, writes b and returns once the forwarder
// closed the connection (or after 15 s, failing).
func send(t *testing.T, addr string, b []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.ReadAll(c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the forwarder did not end the connection: %v", err)
	}
}

// TestAttackSplitLinkForwarderWithoutTheToken: on the head Mac, another local process
// (another tenant's runner, anything reaching loopback) connects to the loopback port
// of a split link the agent forwards to a worker shard's Mac and speaks the worker
// protocol as the head: the worker's agent adds the worker's secret, so on main it was
// a full head (load layers, read the KV cache of the worker's layers). Now the link
// carries a connection only once its first frame carries the link's token, which only
// the head's runner gets (on its standard input): a process without it, or with
// another, reaches nothing and the worker's agent is not even dialed; the head's runner
// with it reaches the worker, the token frame stripped.
func TestAttackSplitLinkForwarderWithoutTheToken(t *testing.T) {
	agent := newWorkerAgent(t)
	l := newSplitLinks(nil, nil, nil, logr.Discard())
	l.Dial = agent.dial
	mr := splitReplica("", "")
	t.Cleanup(func() { l.Close(mr.Namespace + "/" + mr.Name) })
	addr, err := l.Addr(mr, "mac-b")
	if err != nil {
		t.Fatal(err)
	}
	// Each sender's greeting names it; the head's runner comes last.
	greeting := func(who string) []byte { return append([]byte{byte(len(who)), 0, 0, 0, 1}, who...) }
	for name, token := range map[string][]byte{
		"no token":    nil,
		"a guess":     bytes.Repeat([]byte{7}, runnerapi.SplitSecretBytes),
		"a short one": []byte("token"),
	} {
		first := greeting(name)
		if token != nil {
			first = append(runnerapi.SplitAuthFrame(token), first...)
		}
		send(t, addr, first)
	}
	links, err := l.Addrs(mr)
	if err != nil {
		t.Fatal(err)
	}
	if links["mac-b"].Addr != addr || len(links["mac-b"].Token) != runnerapi.SplitSecretBytes {
		t.Fatalf("the head's link to mac-b: %q with a token of %d bytes, want %s with %d", links["mac-b"].Addr,
			len(links["mac-b"].Token), addr, runnerapi.SplitSecretBytes)
	}
	honest := greeting("the head's runner")
	send(t, addr, append(runnerapi.SplitAuthFrame(links["mac-b"].Token), honest...))
	deadline := time.After(15 * time.Second)
	for {
		select {
		case b := <-agent.got:
			if bytes.Equal(b, honest) {
				return
			}
			t.Errorf("a local process without the token reached the worker's agent, which got %q", b)
		case <-deadline:
			t.Fatalf("the head's runner, with the token, did not reach the worker's agent")
		}
	}
}

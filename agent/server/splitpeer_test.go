package server_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/agent/splitlink"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
)

// recordingWorker stands in for `macfleet-runner worker`: it sends on got everything
// each connection carried until it closed.
func recordingWorker(t *testing.T) (addr string, got <-chan []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan []byte, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				b, _ := io.ReadAll(c)
				ch <- b
			}()
		}
	}()
	return ln.Addr().String(), ch
}

// frame is a worker protocol frame: the payload's length, the command, the payload.
func frame(cmd byte, payload []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(payload)))
	return append(append(b, cmd), payload...)
}

// TestAttackPeerLinkByAnotherMac: through the real agent API over mutual TLS, the Mac of
// the worker shard before this Mac's (mac-w1, then mac-w here) opens the peer link and
// its greeting and what follows reach the local worker byte for byte. The same Mac
// cannot open a runner's session on it (a first frame other than the peer greeting
// closes the link before the worker sees a byte), nor the head's link; the head's Mac,
// another Mac, and any Mac for a worker shard fed by the head cannot open a peer link.
func TestAttackPeerLinkByAnotherMac(t *testing.T) {
	ca, err := pki.NewCA(time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	workerAddr, got := recordingWorker(t)
	replicas := map[string]*v1alpha1.ModelReplica{
		"team-a/big-0":   splitOf("team-a", "big-0", "mac-h", "mac-w1", "mac-w"),
		"team-b/other-0": splitOf("team-b", "other-0", "mac-x", "mac-w", "mac-w1"),
	}
	me := pki.Node("mac-w")
	a := startAgent(t, agentOptions{noRunner: true, serverCert: certSource(t, ca, &me),
		splitLink: &splitlink.Handler{Self: "mac-w", Log: logr.Discard(), DialTimeout: 2 * time.Second,
			Lookup: func(_ context.Context, ns, name string) (*v1alpha1.ModelReplica, splitlink.Worker) {
				return replicas[ns+"/"+name], splitlink.Worker{Addr: workerAddr}
			}}})
	agentAddr := strings.TrimPrefix(a.url, "https://")
	peerAs := func(node, ns, name string) (net.Conn, error) {
		id := pki.Node(node)
		return splitlink.DialPeer(t.Context(), agentAddr, certSource(t, ca, &id).ClientConfig(me), ns, name)
	}
	received := func(what string) []byte {
		t.Helper()
		select {
		case b := <-got:
			return b
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the worker saw no connection end", what)
			return nil
		}
	}

	// The previous worker's Mac greets the worker as its peer, then pushes.
	session := []byte(strings.Repeat("s", runnerapi.SplitPeerSessionBytes))
	hello := frame(runnerapi.SplitPeerHello, session)
	push := frame(0, append(make([]byte, 8), strings.Repeat("x", 100_000)...)) // status 0, seq, bytes
	c, err := peerAs("mac-w1", "team-a", "big-0")
	if err != nil {
		t.Fatalf("the previous worker's Mac opening the peer link: %v", err)
	}
	if _, err := c.Write(append(append([]byte(nil), hello...), push...)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if b := received("the peer link"); string(b) != string(hello)+string(push) {
		t.Errorf("the worker received %d bytes, want the greeting and the push (%d bytes) byte for byte", len(b), len(hello)+len(push))
	}

	// The same Mac opening a runner's session (HELLO, or any other first frame) on a
	// peer link: closed before the worker sees a byte.
	for _, first := range [][]byte{frame(1, make([]byte, 64)), frame(runnerapi.SplitPeerHello, make([]byte, 8)), []byte("GET / HTTP/1.1\r\n\r\n")} {
		c, err := peerAs("mac-w1", "team-a", "big-0")
		if err != nil {
			t.Fatalf("opening the peer link: %v", err)
		}
		_, _ = c.Write(first)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Errorf("first frame %q: the link stayed open (%v), want it closed", trim(string(first)), err)
		}
		c.Close()
		if b := received("a first frame other than the greeting"); len(b) != 0 {
			t.Errorf("first frame %q: the worker received %q, want nothing", trim(string(first)), trim(string(b)))
		}
	}

	for _, tc := range []struct {
		name, node, ns, repl, want string
	}{
		{"the head's Mac", "mac-h", "team-a", "big-0", "only the Mac of the worker shard before mac-w's in replica team-a/big-0, mac-w1, may open its peer link, not mac-h"},
		{"another Mac", "mac-x", "team-a", "big-0", "not mac-x"},
		{"the worker's own Mac", "mac-w", "team-a", "big-0", "not mac-w"},
		{"a worker shard fed by the head", "mac-x", "team-b", "other-0", "takes its input from the head's runner: it has no peer link"},
		{"the next worker, backwards", "mac-w1", "team-b", "other-0", "takes its input from the head's runner"},
		{"an unknown replica", "mac-w1", "team-a", "nope", "no replica of that name holds a worker shard on mac-w"},
	} {
		c, err := peerAs(tc.node, tc.ns, tc.repl)
		if err == nil {
			c.Close()
			t.Errorf("%s: opened the peer link, want refused", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a 403 saying %q", tc.name, err, tc.want)
		}
	}
	// The previous worker's Mac is no head: the head's link stays closed to it.
	id := pki.Node("mac-w1")
	if c, err := splitlink.Dial(t.Context(), agentAddr, certSource(t, ca, &id).ClientConfig(me), "team-a", "big-0"); err == nil {
		c.Close()
		t.Error("the previous worker's Mac opened the head's link, want refused")
	} else if !strings.Contains(err.Error(), "only the Mac of replica team-a/big-0's head, mac-h") {
		t.Errorf("the previous worker's Mac on the head's link: %v", err)
	}
}

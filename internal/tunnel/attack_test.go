package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/macfleet/macfleet/internal/pki"
)

// TestAttackTunnelClaimsAnotherMac: an agent holding mac-b's certificate dials the
// gateway claiming to be mac-a, to receive mac-a's requests (its prompts, its
// answers). The gateway refuses the tunnel, and mac-a's requests never reach it: not
// while it claims mac-a, and not through the tunnel it may hold as mac-b.
func TestAttackTunnelClaimsAnotherMac(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	macB := source(t, fc.ca, pki.Node("mac-b"))

	a := &Agent{Gateway: addr, Node: "mac-a", Certificates: macB}
	_, err := a.Connect(context.Background())
	var refused *RefusedError
	if !errors.As(err, &refused) || !strings.Contains(refused.Reason, `Mac "mac-b"'s, the agent claims to be "mac-a"`) {
		t.Fatalf("claiming mac-a with mac-b's certificate: %v, want the gateway's refusal naming both", err)
	}
	if n := s.Nodes(); len(n) != 0 {
		t.Fatalf("tunnels filed under %v after a refused claim", n)
	}

	// As mac-b it is admitted, and filed under mac-b only.
	var served atomic.Int32
	startAgent(t, addr, "mac-b", macB, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		_, _ = w.Write([]byte("mac-b's agent"))
	}))
	waitNodes(t, s, "mac-b")
	c := client(s, fc.gateway)
	if _, err := get(context.Background(), c, "mac-a", "/v1/chat/completions"); err == nil {
		t.Fatal("a request for mac-a was answered while only mac-b holds a tunnel")
	}
	if n := served.Load(); n != 0 {
		t.Fatalf("mac-b's agent served %d requests meant for mac-a", n)
	}
	// Even a stream of mac-b's tunnel dialed for mac-a fails the TLS check of the Mac
	// meant: the connection's identity is checked twice.
	conn, err := s.Dial("mac-b")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tc := tls.Client(conn, fc.gateway.ClientConfig(pki.Node("mac-a")))
	if err := tc.HandshakeContext(context.Background()); err == nil {
		t.Fatal("mac-b's agent passed the TLS check for mac-a")
	}
	if n := served.Load(); n != 0 {
		t.Fatalf("mac-b's agent served %d requests meant for mac-a", n)
	}
}

// TestAttackTunnelStreamsTowardTheGateway: a Mac with a tunnel opens streams of its own
// on it, to reach the gateway (or what the gateway reaches) from inside. Every one is
// closed unanswered.
func TestAttackTunnelStreamsTowardTheGateway(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	a := &Agent{Gateway: addr, Node: "mac-b", Certificates: source(t, fc.ca, pki.Node("mac-b"))}
	sess, err := a.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	waitNodes(t, s, "mac-b")
	for i := range 3 {
		st, err := sess.Open()
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		_, _ = st.Write([]byte("GET / HTTP/1.1\r\nHost: gateway\r\n\r\n"))
		_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(st)
		if len(b) != 0 || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, yamux.ErrTimeout) {
			t.Fatalf("stream %d toward the gateway: read %q, %v; want it closed unanswered", i, b, err)
		}
		st.Close()
	}
}

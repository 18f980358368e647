package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/macfleet/macfleet/internal/pki"
)

func TestChooseOutbound(t *testing.T) {
	for _, tc := range []struct {
		name      string
		reachable bool
		err       error
		want      bool
	}{
		{name: "reached at its address", reachable: true, want: false},
		{name: "not reached", reachable: false, want: true},
		{name: "the gateway not reached", err: errors.New("dial tcp: connection refused"), want: true},
		{name: "a gateway without probes", err: &RefusedError{Reason: "the opening line names no Mac"}, want: true},
	} {
		if got := ChooseOutbound(tc.reachable, tc.err); got != tc.want {
			t.Errorf("%s: ChooseOutbound = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestProbe: the gateway answers a Mac's probe by dialing the address and requiring
// that Mac's certificate there: reachable at its own listener; unreachable where
// nothing listens, and where another Mac's agent answers.
func TestProbe(t *testing.T) {
	fc := newFleetCerts(t)
	_, addr := startGateway(t, fc.gateway)
	a := &Agent{Gateway: addr, Node: "mac-a", Certificates: source(t, fc.ca, pki.Node("mac-a"))}
	own := serveDirect(t, source(t, fc.ca, pki.Node("mac-a")), whoami("mac-a"))
	other := serveDirect(t, source(t, fc.ca, pki.Node("mac-b")), whoami("mac-b"))
	for _, tc := range []struct {
		name, addr string
		want       bool
	}{
		{name: "its own listener", addr: own, want: true},
		{name: "nothing listening", addr: unreachable, want: false},
		{name: "another Mac's listener", addr: other, want: false},
	} {
		got, err := a.Probe(t.Context(), tc.addr)
		if err != nil || got != tc.want {
			t.Errorf("%s: Probe = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if _, err := a.Probe(t.Context(), ""); err == nil || !strings.Contains(err.Error(), "names no address") {
		t.Errorf("a probe of no address: %v, want the gateway's refusal", err)
	}
}

// TestAgentAutoConnect: with --connect auto, an agent the gateway does not reach at
// its advertised address holds a tunnel and serves through it; one the gateway
// reaches holds none.
func TestAgentAutoConnect(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	log, decided := reachedLog()
	macR := source(t, fc.ca, pki.Node("mac-r"))
	reached := &Agent{Gateway: addr, Node: "mac-r", Certificates: macR, Log: log,
		Advertised: serveDirect(t, macR, whoami("mac-r"))}
	behindNAT := &Agent{Gateway: addr, Node: "mac-n", Certificates: source(t, fc.ca, pki.Node("mac-n")), Log: log, Advertised: unreachable}
	runAgents(t, reached, behindNAT)
	waitNodes(t, s, "mac-n")
	if got, err := get(t.Context(), client(s, fc.gateway), "mac-n", "/"); err != nil || got != "mac-n for macfleet://gateway/gw" {
		t.Errorf("mac-n through its tunnel: %q, %v", got, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for decided.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("mac-r's agent did not decide that the gateway reaches it")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if slices.Contains(s.Nodes(), "mac-r") {
		t.Errorf("mac-r holds a tunnel though the gateway reaches it at its address")
	}
}

// TestAgentAutoDialsOutWhenItsAddressStops: an agent of --connect auto that the
// gateway reached at its advertised address holds no tunnel; once its address stops
// answering (the Mac moved behind a NAT), its next probe finds it unreachable and it
// dials out (within ProbeEvery and the gateway's wait for the failed probe; waitNodes
// allows 10 s, where a probe every 5 minutes would not have come).
func TestAgentAutoDialsOutWhenItsAddressStops(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	log, probes := reachedLog()
	mac := source(t, fc.ca, pki.Node("mac-r"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	direct := &http.Server{Handler: whoami("mac-r"), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = direct.Serve(tls.NewListener(ln, mac.ServerConfig())) }()
	t.Cleanup(func() { direct.Close() })
	const every = 200 * time.Millisecond
	a := &Agent{Gateway: addr, Node: "mac-r", Certificates: mac, Log: log, Advertised: ln.Addr().String(), ProbeEvery: every}
	runAgents(t, a)
	deadline := time.Now().Add(10 * time.Second)
	for probes.Load() < 2 { // reached, and reached again: it probes on while reached
		if time.Now().After(deadline) {
			t.Fatalf("mac-r's agent was found reachable %d times, want 2", probes.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(s.Nodes()) != 0 {
		t.Fatalf("tunnels from %v while the gateway reaches mac-r at its address", s.Nodes())
	}
	stopped := time.Now()
	direct.Close() // its address answers no more
	waitNodes(t, s, "mac-r")
	t.Logf("mac-r dialed out %v after its address stopped answering (a probe every %v, a failed one answered after %v)",
		time.Since(stopped).Round(time.Millisecond), every, probeWait)
	if got, err := get(t.Context(), client(s, fc.gateway), "mac-r", "/"); err != nil || got != "mac-r for macfleet://gateway/gw" {
		t.Errorf("mac-r through its tunnel: %q, %v", got, err)
	}
}

// reachedLog is a logger (level 1 on) that counts an agent's answers "the gateway
// reaches this Mac; not dialing out".
func reachedLog() (logr.Logger, *atomic.Int32) {
	var n atomic.Int32
	return funcr.New(func(_, args string) {
		if strings.Contains(args, "not dialing out") {
			n.Add(1)
		}
	}, funcr.Options{Verbosity: 1}), &n
}

// runAgents runs each agent until the test ends, serving whoami of its node through
// its tunnels.
func runAgents(t *testing.T, agents ...*Agent) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, a := range agents {
		srv := &http.Server{Handler: whoami(a.Node), ReadHeaderTimeout: 10 * time.Second}
		t.Cleanup(func() { srv.Close() })
		go func() {
			_ = a.Run(ctx, func(ln net.Listener) error { return srv.Serve(tls.NewListener(ln, a.Certificates.ServerConfig())) })
		}()
	}
}

// TestAttackTunnelProbeScansTheGatewaysNetwork: a Mac probes addresses it does not
// serve at, to learn what listens where the gateway dials (a closed port, a port that
// takes TCP and no TLS, another Mac's agent). Every answer is the same word, after the
// same wait: nothing tells them apart.
func TestAttackTunnelProbeScansTheGatewaysNetwork(t *testing.T) {
	fc := newFleetCerts(t)
	_, addr := startGateway(t, fc.gateway)
	a := &Agent{Gateway: addr, Node: "mac-a", Certificates: source(t, fc.ca, pki.Node("mac-a"))}
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	go func() {
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
			c.Close()
		}
	}()
	other := serveDirect(t, source(t, fc.ca, pki.Node("mac-b")), whoami("mac-b"))
	for _, target := range []string{unreachable, plain.Addr().String(), other} {
		c, err := a.dialGateway(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, _ = c.Write([]byte(ProbeProtocol + " " + target + "\n"))
		answer, err := readLine(c)
		took := time.Since(start)
		c.Close()
		if err != nil || answer != "unreachable" || took < probeWait {
			t.Errorf("probing %s: %q after %v (%v); want \"unreachable\" after %v, whatever listens there", target, answer, took, err, probeWait)
		}
	}
}

package tunnel

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/pki"
)

func TestPeerRoute(t *testing.T) {
	for _, tc := range []struct {
		source, target bool
		viaGateway, ok bool
	}{
		{source: false, target: false, viaGateway: false, ok: true},
		{source: true, target: false, viaGateway: false, ok: false},
		{source: false, target: true, viaGateway: false, ok: true},
		{source: true, target: true, viaGateway: true, ok: true},
	} {
		via, ok := PeerRoute(tc.source, tc.target)
		if via != tc.viaGateway || ok != tc.ok {
			t.Errorf("PeerRoute(source tunnel %v, target tunnel %v) = %v, %v; want %v, %v", tc.source, tc.target, via, ok, tc.viaGateway, tc.ok)
		}
	}
}

func TestAdmitPeer(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	valid := grant{until: now.Add(time.Second)}
	for _, tc := range []struct {
		name, line string
		g          grant
		found      bool
		linked     bool
		want, err  string
	}{
		{name: "granted", line: PeerProtocol + " mac-a", g: valid, found: true, want: "mac-a"},
		{name: "not granted", line: PeerProtocol + " mac-a", err: `no gateway asked Mac "mac-b" to fetch from Mac "mac-a", and no split replica links them`},
		{name: "linked", line: PeerProtocol + " mac-a", linked: true, want: "mac-a"},
		{name: "linked, ticket expired", line: PeerProtocol + " mac-a", g: grant{until: now}, found: true, linked: true, want: "mac-a"},
		{name: "linked to itself", line: PeerProtocol + " mac-b", linked: true, err: "not from itself"},
		{name: "expired", line: PeerProtocol + " mac-a", g: grant{until: now}, found: true, err: "expired"},
		{name: "itself", line: PeerProtocol + " mac-b", g: valid, found: true, err: "not from itself"},
		{name: "no peer", line: PeerProtocol + " ", err: "names no peer"},
		{name: "another protocol", line: "GET / HTTP/1.1", err: "names no peer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AdmitPeer("mac-b", tc.line, tc.g, tc.found, tc.linked, now)
			switch {
			case tc.err == "" && (err != nil || got != tc.want):
				t.Errorf("AdmitPeer = %q, %v; want %q", got, err, tc.want)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("AdmitPeer = %q, %v; want an error with %q", got, err, tc.err)
			}
		})
	}
}

// peerGet is a GET of path on node's agent over conns that dial, with from's
// certificate and TLS requiring node's, as an agent's peer fetch does.
func peerGet(t *testing.T, from *pki.Source, dial func(ctx context.Context, network, addr string) (net.Conn, error), node, path string) (string, error) {
	t.Helper()
	c := &http.Client{Transport: pki.NewTransports(from, func() *http.Transport {
		return &http.Transport{DialContext: dial}
	})}
	defer c.CloseIdleConnections()
	return get(t.Context(), c, node, path)
}

// TestPeerFetchThroughTheTunnels: a Mac that dials out (mac-b), asked by the gateway
// to fetch from a Mac that dials out too (mac-a), reaches it through the two tunnels,
// with TLS between the two Macs inside (mac-a sees mac-b's certificate); asked to
// fetch from a Mac without a tunnel (mac-d), it dials mac-d's address itself.
func TestPeerFetchThroughTheTunnels(t *testing.T) {
	fc, s, macB, b := twoTunnels(t)
	direct := serveDirect(t, source(t, fc.ca, pki.Node("mac-d")), whoami("mac-d"))

	s.Grant(t.Context(), "mac-b", "mac-a", time.Now().Add(time.Minute))
	s.Grant(t.Context(), "mac-b", "mac-d", time.Now().Add(time.Minute))
	var dialed []string // the addresses mac-b dialed itself
	d := &net.Dialer{Timeout: time.Second}
	at := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialed = append(dialed, addr)
		if addr == unreachable {
			addr = direct // mac-d's address, as mac-b's own routes reach it
		}
		return d.DialContext(ctx, network, addr)
	}
	for _, node := range []string{"mac-a", "mac-d"} {
		got, err := peerGet(t, macB, b.DialContext(pki.NodeFrom, at), node, "/api/models/m/states/d")
		if want := node + " for macfleet://node/mac-b"; err != nil || got != want {
			t.Errorf("mac-b fetching from %s: %q, %v; want %q", node, got, err, want)
		}
	}
	if len(dialed) != 1 {
		t.Errorf("mac-b dialed %v itself; want mac-d's address only (mac-a through the tunnels)", dialed)
	}
}

// twoTunnels is a gateway holding the tunnels of mac-a and mac-b, whose agents answer
// with who they are and who called; macB is mac-b's certificates, b its agent.
func twoTunnels(t *testing.T) (fc *fleetCerts, s *Sessions, macB *pki.Source, b *Agent) {
	t.Helper()
	fc = newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	macB = source(t, fc.ca, pki.Node("mac-b"))
	startAgent(t, addr, "mac-a", source(t, fc.ca, pki.Node("mac-a")), whoami("mac-a"))
	b = startAgent(t, addr, "mac-b", macB, whoami("mac-b"))
	waitNodes(t, s, "mac-a", "mac-b")
	waitSession(t, b)
	return fc, s, macB, b
}

// waitSession waits until a's tunnel is up on its side (the gateway files it first).
func waitSession(t testing.TB, a *Agent) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.mu.Lock()
		up := a.sess != nil
		a.mu.Unlock()
		if up {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's agent holds no tunnel", a.Node)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAttackTunnelRelayToAnyMac: a Mac that dials out (mac-b) asks the gateway to
// relay it to another Mac's agent (mac-a) that no gateway asked it to fetch from, to
// a Mac it was asked to fetch from once the ask expired, and to a Mac it was asked
// to fetch from through a Mac it was not: every relay is refused, and mac-a's agent
// serves nothing.
func TestAttackTunnelRelayToAnyMac(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	var served atomic.Int32
	startAgent(t, addr, "mac-a", source(t, fc.ca, pki.Node("mac-a")), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
	}))
	b := startAgent(t, addr, "mac-b", source(t, fc.ca, pki.Node("mac-b")), whoami("mac-b"))
	startAgent(t, addr, "mac-c", source(t, fc.ca, pki.Node("mac-c")), whoami("mac-c"))
	waitNodes(t, s, "mac-a", "mac-b", "mac-c")
	waitSession(t, b)

	refused := func(what, want string) {
		t.Helper()
		_, err := b.DialPeer(t.Context(), "mac-a")
		var re *RefusedError
		if !errors.As(err, &re) || !strings.Contains(re.Reason, want) {
			t.Errorf("%s: %v; want the gateway's refusal with %q", what, err, want)
		}
	}
	refused("never asked", `no gateway asked Mac "mac-b" to fetch from Mac "mac-a"`)
	s.Grant(t.Context(), "mac-c", "mac-a", time.Now().Add(time.Minute))
	refused("asked of another Mac", `no gateway asked Mac "mac-b" to fetch from Mac "mac-a"`)
	s.Grant(t.Context(), "mac-b", "mac-a", time.Now().Add(-time.Second))
	refused("expired", "expired")
	// A Mac without a tunnel is never dialed by the gateway for a Mac, granted or not:
	// its address is one a Mac wrote.
	s.Grant(t.Context(), "mac-b", "mac-x", time.Now().Add(time.Minute))
	if _, err := b.DialPeer(t.Context(), "mac-x"); !errors.Is(err, ErrNoSession) {
		t.Errorf("mac-b asking for mac-x, which holds no tunnel: %v; want ErrNoSession (dial it yourself)", err)
	}
	// A split replica's links go one way, between the Macs it names.
	s.SetLinks(map[Link]bool{{From: "mac-a", To: "mac-b"}: true, {From: "mac-c", To: "mac-a"}: true})
	refused("linked the other way, and from another Mac", `no gateway asked Mac "mac-b" to fetch from Mac "mac-a"`)
	if n := served.Load(); n != 0 {
		t.Fatalf("mac-a's agent served %d requests of relays it was not granted", n)
	}
}

// TestSplitLinkThroughTheTunnels: while a Link from mac-b to mac-a stands (a split
// replica's head on mac-b, a worker shard on mac-a), mac-b reaches mac-a's agent
// through the two tunnels, with TLS between the two Macs inside; once the link is
// gone (the replica was), it is refused again.
func TestSplitLinkThroughTheTunnels(t *testing.T) {
	_, s, macB, b := twoTunnels(t)
	through := func(ctx context.Context, network, addr string) (net.Conn, error) { return b.DialPeer(ctx, "mac-a") }

	s.SetLinks(map[Link]bool{{From: "mac-b", To: "mac-a"}: true})
	if got, err := peerGet(t, macB, through, "mac-a", "/split"); err != nil || got != "mac-a for macfleet://node/mac-b" {
		t.Errorf("mac-b over its split link to mac-a: %q, %v; want mac-a's agent seeing mac-b's certificate", got, err)
	}
	s.SetLinks(nil)
	var re *RefusedError
	if _, err := b.DialPeer(t.Context(), "mac-a"); !errors.As(err, &re) {
		t.Errorf("mac-b once the link is gone: %v; want the gateway's refusal", err)
	}
}

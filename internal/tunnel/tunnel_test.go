package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/macfleet/macfleet/internal/pki"
)

// unreachable is an advertised address nothing listens on: a Mac behind a NAT.
const unreachable = "127.0.0.1:9"

// fleetCerts are a fleet CA's certificates for a gateway and for Macs.
type fleetCerts struct {
	ca      *pki.CA
	gateway *pki.Source
}

func newFleetCerts(t testing.TB) *fleetCerts {
	t.Helper()
	ca, err := pki.NewCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &fleetCerts{ca: ca, gateway: source(t, ca, pki.Gateway("gw"))}
}

func source(t testing.TB, ca *pki.CA, id pki.Identity) *pki.Source {
	t.Helper()
	s, err := ca.NewSource(&id, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// probeWait is the tests' gateways' Sessions.ProbeWait.
const probeWait = 300 * time.Millisecond

// startGateway serves tunnels on a loopback port until the test ends.
func startGateway(t testing.TB, certs *pki.Source) (*Sessions, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Sessions{Certificates: certs, Log: testr.NewWithInterface(t, testr.Options{}), ProbeWait: probeWait}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

// startAgent runs a Mac's agent that serves h through its tunnel, as the agent serves
// its API: TLS with its node certificate inside each stream.
func startAgent(t testing.TB, gw, node string, certs *pki.Source, h http.Handler) *Agent {
	t.Helper()
	a := &Agent{Gateway: gw, Node: node, Certificates: certs, MinBackoff: 20 * time.Millisecond, Log: testr.NewWithInterface(t, testr.Options{})}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- a.Run(ctx, func(ln net.Listener) error { return srv.Serve(tls.NewListener(ln, certs.ServerConfig())) })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Agent.Run: %v", err)
		}
		srv.Close()
	})
	return a
}

// serveDirect serves h with certs on a loopback port, as a Mac the gateway reaches at
// its address, until the test ends: the address.
func serveDirect(t testing.TB, certs *pki.Source, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(tls.NewListener(ln, certs.ServerConfig())) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// client is the gateway's transport to the agents, with the tunnels' dial.
func client(s *Sessions, certs *pki.Source) *http.Client {
	d := &net.Dialer{Timeout: time.Second}
	return &http.Client{Transport: pki.NewTransports(certs, func() *http.Transport {
		return &http.Transport{DialContext: s.DialContext(pki.NodeFrom, d.DialContext), MaxIdleConnsPerHost: 64}
	})}
}

func waitNodes(t testing.TB, s *Sessions, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(s.Nodes(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("tunnels from %v, want %v", s.Nodes(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func get(ctx context.Context, c *http.Client, node, path string) (string, error) {
	req, err := http.NewRequestWithContext(pki.WithNode(ctx, node), http.MethodGet, "https://"+unreachable+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// whoami answers the name of the Mac serving and the caller's certificate.
func whoami(node string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller := "none"
		if id, ok := pki.PeerIdentity(r.TLS); ok {
			caller = id.String()
		}
		fmt.Fprintf(w, "%s for %s", node, caller)
	})
}

func TestAdmit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		id      pki.Identity
		hasCert bool
		claim   string
		want    string
		wantErr string
	}{
		{name: "its own Mac", id: pki.Node("mac-a"), hasCert: true, claim: "mac-a", want: "mac-a"},
		{name: "another Mac", id: pki.Node("mac-b"), hasCert: true, claim: "mac-a", wantErr: `Mac "mac-b"'s, the agent claims to be "mac-a"`},
		{name: "no certificate", claim: "mac-a", wantErr: "no client certificate"},
		{name: "a gateway's certificate", id: pki.Gateway("gw"), hasCert: true, claim: "gw", wantErr: "not a Mac's"},
		{name: "no claim", id: pki.Node("mac-a"), hasCert: true, wantErr: "names no Mac"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Admit(tc.id, tc.hasCert, tc.claim)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Admit = %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Admit = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestTunnelCarriesTheAgentsAPI(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	startAgent(t, addr, "mac-a", source(t, fc.ca, pki.Node("mac-a")), whoami("mac-a"))
	waitNodes(t, s, "mac-a")
	c := client(s, fc.gateway)
	// The Mac's advertised address answers nothing: the answer came through the tunnel,
	// with the gateway's certificate checked by the agent's TLS inside the stream.
	got, err := get(context.Background(), c, "mac-a", "/")
	if err != nil {
		t.Fatal(err)
	}
	if want := "mac-a for " + pki.Gateway("gw").String(); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	// A Mac without a tunnel is dialed at its address, as before.
	if _, err := get(context.Background(), c, "mac-c", "/"); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("a Mac with no tunnel: %v, want a direct dial refused", err)
	}
}

func TestTunnelStreamsAndCancels(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	ended := make(chan error, 1)
	startAgent(t, addr, "mac-a", source(t, fc.ca, pki.Node("mac-a")), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "data: %d\n", i); err != nil {
				ended <- err
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				ended <- r.Context().Err()
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}))
	waitNodes(t, s, "mac-a")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(pki.WithNode(ctx, "mac-a"), http.MethodGet, "https://"+unreachable+"/stream", nil)
	resp, err := client(s, fc.gateway).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	for i := range 3 {
		if !sc.Scan() || sc.Text() != fmt.Sprintf("data: %d", i) {
			t.Fatalf("event %d: %q, %v", i, sc.Text(), sc.Err())
		}
	}
	// Closing the stream (the client went away) ends the handler on the Mac.
	cancel()
	resp.Body.Close()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the handler ended without an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the agent's handler still streams 10 s after the client went away")
	}
}

func TestTunnelReconnects(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	startAgent(t, addr, "mac-a", source(t, fc.ca, pki.Node("mac-a")), whoami("mac-a"))
	waitNodes(t, s, "mac-a")
	s.mu.Lock()
	first := s.byNode["mac-a"]
	s.mu.Unlock()
	first.Close() // the link dropped
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		cur := s.byNode["mac-a"]
		s.mu.Unlock()
		if cur != nil && cur != first && !cur.IsClosed() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent did not dial again within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, err := get(context.Background(), client(s, fc.gateway), "mac-a", "/"); err != nil || !strings.HasPrefix(got, "mac-a ") {
		t.Fatalf("after reconnecting: %q, %v", got, err)
	}
}

func TestTunnelRefusesWhatIsNotAMacOfTheFleet(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	other, err := pki.NewCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign := source(t, other, pki.Node("mac-a"))
	// It trusts the fleet's CA, so that the gateway's check is the one tried.
	if err := foreign.SetBundle(pki.EncodeCerts(fc.ca.Cert)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		certs *pki.Source
		node  string
		want  string
	}{
		{name: "a gateway's certificate", certs: source(t, fc.ca, pki.Gateway("gw")), node: "gw", want: "not a Mac's"},
		{name: "another CA's Mac", certs: foreign, node: "mac-a", want: "tls: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{Gateway: addr, Node: tc.node, Certificates: tc.certs}
			_, err := a.Connect(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Connect: %v, want an error with %q", err, tc.want)
			}
		})
	}
	if n := s.Nodes(); len(n) != 0 {
		t.Fatalf("tunnels from %v, want none", n)
	}
	// The agent checks the gateway: a Mac's certificate at the tunnel's address is not one.
	impostor, iaddr := startGateway(t, source(t, fc.ca, pki.Node("mac-z")))
	a := &Agent{Gateway: iaddr, Node: "mac-a", Certificates: source(t, fc.ca, pki.Node("mac-a"))}
	if _, err := a.Connect(context.Background()); err == nil || !strings.Contains(err.Error(), "not a gateway's") {
		t.Fatalf("Connect to a Mac posing as the gateway: %v", err)
	}
	if n := impostor.Nodes(); len(n) != 0 {
		t.Fatalf("the impostor holds tunnels from %v", n)
	}
	var refused *RefusedError
	if errors.As(err, &refused) {
		t.Fatalf("the agent's own check should fail before any answer: %v", err)
	}
}

// TestTunnelKeepsConnectionsAlive: sequential requests reuse one connection (one
// stream, one TLS handshake), as over a direct connection: the agent's HTTP server
// ends a pending read with a past deadline after each response, which a deadline
// error that TLS takes for a broken link turned into a new stream per request.
func TestTunnelKeepsConnectionsAlive(t *testing.T) {
	fc := newFleetCerts(t)
	s, addr := startGateway(t, fc.gateway)
	startAgent(t, addr, "mac-a", source(t, fc.ca, pki.Node("mac-a")), whoami("mac-a"))
	waitNodes(t, s, "mac-a")
	var dials atomic.Int32
	d := &net.Dialer{Timeout: time.Second}
	dial := s.DialContext(pki.NodeFrom, d.DialContext)
	c := &http.Client{Transport: pki.NewTransports(fc.gateway, func() *http.Transport {
		return &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dial(ctx, network, addr)
		}}
	})}
	for i := range 20 {
		if _, err := get(context.Background(), c, "mac-a", "/"); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("20 sequential requests opened %d streams, want 1 kept alive", n)
	}
}

package testenv

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
)

// Relay forwards TCP connections from a reserved loopback port to a target. Cut closes
// the listener and every relayed connection, so clients see their connections end and
// new ones refused, as when the API server goes away; Restore listens again on the same
// port.
type Relay struct {
	tb     testing.TB
	target string
	port   *Port

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
}

// NewRelay starts a relay to target (host:port); it is cut when the test ends.
func NewRelay(tb testing.TB, target string) *Relay {
	tb.Helper()
	r := &Relay{tb: tb, target: target, port: ReservePort(tb), conns: map[net.Conn]struct{}{}}
	r.Restore()
	tb.Cleanup(r.Cut)
	return r
}

// RelayConfig starts a relay to cfg's API server and returns a copy of cfg that
// reaches it through the relay.
func RelayConfig(tb testing.TB, cfg *rest.Config) (*rest.Config, *Relay) {
	tb.Helper()
	u, err := url.Parse(cfg.Host)
	if err != nil || u.Host == "" {
		tb.Fatalf("API server host %q: %v", cfg.Host, err)
	}
	r := NewRelay(tb, u.Host)
	rc := rest.CopyConfig(cfg)
	u.Host = r.Addr()
	rc.Host = u.String()
	return rc, r
}

// Addr is the relay's host:port.
func (r *Relay) Addr() string { return r.port.Addr }

// Cut closes the listener and every relayed connection.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
}

// Restore listens again (a no-op while listening).
func (r *Relay) Restore() {
	r.tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		return
	}
	ln, err := r.port.Listen()
	if err != nil {
		r.tb.Fatalf("relay listening on %s: %v", r.port.Addr, err)
	}
	r.ln = ln
	go r.accept(ln)
}

func (r *Relay) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go r.forward(ln, c)
	}
}

func (r *Relay) forward(ln net.Listener, c net.Conn) {
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	if r.ln != ln {
		// Cut while dialing.
		r.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	r.conns[c], r.conns[up] = struct{}{}, struct{}{}
	r.mu.Unlock()
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		dst.Close()
		src.Close()
	}
	wg.Add(2)
	go pipe(up, c)
	go pipe(c, up)
	wg.Wait()
	r.mu.Lock()
	delete(r.conns, c)
	delete(r.conns, up)
	r.mu.Unlock()
}

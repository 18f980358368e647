// Package tcprelay forwards TCP connections from a loopback port to a target and can
// cut them all at once: to its clients that is indistinguishable from the target
// going away. The local fleet (make demo, the e2e suite) reaches its API server
// through one, and tests use it to cut a component off the API server.
//
// The port is held for the relay's lifetime by a socket bound to it but not
// listening, so a cut relay refuses connections and no other process can take its
// port before Restore listens on it again.
package tcprelay

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Port is a loopback TCP port held by a socket bound to it but not listening:
// connections to Addr are refused until Listen, and no other program can bind it.
type Port struct {
	Addr string
	fd   int
}

// Reserve holds a free loopback port until Close.
func Reserve() (*Port, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return nil, fmt.Errorf("reserving a port: %w", err)
	}
	// SO_REUSEPORT lets Listen's sockets (which set it too) share the port; sockets
	// without it, as other programs' are, cannot bind it.
	if err := syscall.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("reserving a port: %w", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("reserving a port: %w", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("reserving a port: %w", err)
	}
	return &Port{Addr: fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port), fd: fd}, nil
}

// Listen listens on the port; once that listener is closed the port refuses
// connections again, and Listen may be called again.
func (p *Port) Listen() (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", p.Addr)
}

// Close gives the port back.
func (p *Port) Close() error { return syscall.Close(p.fd) }

// Relay forwards connections from its port to a target.
type Relay struct {
	target string
	port   *Port

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
}

// New starts a relay to target (host:port) on a reserved loopback port.
func New(target string) (*Relay, error) {
	p, err := Reserve()
	if err != nil {
		return nil, err
	}
	r := &Relay{target: target, port: p, conns: map[net.Conn]struct{}{}}
	if err := r.Restore(); err != nil {
		_ = p.Close()
		return nil, err
	}
	return r, nil
}

// Addr is the relay's host:port.
func (r *Relay) Addr() string { return r.port.Addr }

// Cut closes the listener and every relayed connection; new connections are refused.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cutLocked()
}

func (r *Relay) cutLocked() {
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
}

// Restore listens again on the same port (a no-op while listening).
func (r *Relay) Restore() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("relay to %s is closed", r.target)
	}
	if r.ln != nil {
		return nil
	}
	ln, err := r.port.Listen()
	if err != nil {
		return fmt.Errorf("relay listening on %s: %w", r.port.Addr, err)
	}
	r.ln = ln
	go r.accept(ln)
	return nil
}

// Close cuts the relay for good and gives its port back.
func (r *Relay) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	r.cutLocked()
	_ = r.port.Close()
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

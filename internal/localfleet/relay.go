package localfleet

import (
	"io"
	"net"
	"strings"
	"sync"
)

// relay forwards TCP connections from a loopback port to the API server, and can cut
// them all: to the fleet that is indistinguishable from the API server going away.
type relay struct {
	target string

	mu     sync.Mutex
	listen string
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
}

func newRelay(apiServerURL string) (*relay, error) {
	target := apiServerURL
	for _, p := range []string{"https://", "http://"} {
		target = strings.TrimPrefix(target, p)
	}
	target = strings.TrimSuffix(target, "/")
	r := &relay{target: target, listen: "127.0.0.1:0", conns: map[net.Conn]struct{}{}}
	if err := r.restore(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *relay) addr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.listen
}

// restore listens again on the same address.
func (r *relay) restore() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", r.listen)
	if err != nil {
		return err
	}
	r.ln, r.listen = ln, ln.Addr().String()
	go r.accept(ln)
	return nil
}

func (r *relay) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go r.forward(c)
	}
}

func (r *relay) forward(c net.Conn) {
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	if r.ln == nil {
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
		// An error (a reset, or cut closing the pair) ends the pair like a clean close.
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

// cut closes the listener and every relayed connection.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Close()
	}
}

func (r *relay) close() { r.cut() }

package tcprelay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestReserve: the port refuses connections, serves them while listened on, refuses
// them again once the listener is closed, can be listened on again, and is never
// free for a socket of another program meanwhile.
func TestReserve(t *testing.T) {
	p, err := Reserve()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	refused := func(when string) {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr)
		if err == nil {
			c.Close()
			t.Fatalf("%s: dialing %s succeeded, want refused", when, p.Addr)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("%s: dialing %s: %v, want connection refused", when, p.Addr, err)
		}
	}
	taken := func(when string) {
		t.Helper()
		if l, err := net.Listen("tcp", p.Addr); err == nil {
			l.Close()
			t.Fatalf("%s: another listener took %s", when, p.Addr)
		}
	}
	refused("reserved")
	taken("reserved")
	for round := range 2 {
		l, err := p.Listen()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		c, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatalf("round %d: dialing the listener: %v", round, err)
		}
		c.Close()
		l.Close()
		refused("listener closed")
		taken("listener closed")
	}
}

// TestRelayCutAndRestore: a relay forwards to its target; Cut ends the connections it
// relays and refuses new ones; Restore serves again on the same address.
func TestRelayCutAndRestore(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }() // echo
		}
	}()
	r, err := New(target.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	echo := func() (net.Conn, error) {
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			return nil, err
		}
		if _, err := c.Write([]byte("ping")); err != nil {
			c.Close()
			return nil, err
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			c.Close()
			return nil, fmt.Errorf("echo through the relay: %q, %v", buf, err)
		}
		return c, nil
	}
	open, err := echo()
	if err != nil {
		t.Fatal(err)
	}
	r.Cut()
	_ = open.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := open.Read(make([]byte, 1)); err == nil {
		t.Errorf("a relayed connection read %d bytes after the cut, want it closed", n)
	}
	open.Close()
	if c, err := net.Dial("tcp", r.Addr()); err == nil {
		c.Close()
		t.Error("the cut relay accepted a connection")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dialing the cut relay: %v, want connection refused", err)
	}
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	c, err := echo()
	if err != nil {
		t.Fatalf("after Restore: %v", err)
	}
	c.Close()
}

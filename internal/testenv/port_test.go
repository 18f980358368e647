package testenv

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestReservePort: the port refuses connections, serves them while listened on, refuses
// them again once the listener is closed, can be listened on again, and is never
// free for a socket of another program meanwhile.
func TestReservePort(t *testing.T) {
	p := ReservePort(t)
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

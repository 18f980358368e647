package httpserver

import (
	"net"
	"strings"
	"testing"
	"time"
)

// addrConn is a connection from addr that is never read or written.
type addrConn struct {
	net.Conn
	addr net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.addr }
func (c addrConn) Close() error         { return nil }

func from(ip string) net.Conn {
	return addrConn{addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}}
}

// TestCapListenerAdmit walks the caps' decisions with a fake clock: the cap per
// source, the global cap, and under pressure the closing of connections idle for the
// pressure timeout (kept alive, or never sent a request), never of busy ones.
func TestCapListenerAdmit(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	newL := func() *capListener {
		return Listener(nil, Limits{MaxConnections: 8, MaxConnectionsPerSource: 3, PressureIdleTimeout: 5 * time.Second}).(*capListener)
	}
	type step struct {
		ip   string
		at   time.Duration
		busy bool // the connection then serves a request
		// want: "ok", "source" (refused by its source's cap) or "full" (the global cap);
		// stale: how many idle connections it closed.
		want  string
		stale int
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a source is capped, another is not", []step{
			{ip: "127.0.0.1", want: "ok"}, {ip: "127.0.0.1", want: "ok"}, {ip: "127.0.0.1", want: "ok"},
			{ip: "127.0.0.1", want: "source"}, {ip: "127.0.0.2", want: "ok"},
		}},
		{"an IPv6 /64 is one source", []step{
			{ip: "2001:db8::1", want: "ok"}, {ip: "2001:db8::2", want: "ok"}, {ip: "2001:db8::ffff:1", want: "ok"},
			{ip: "2001:db8::3", want: "source"}, {ip: "2001:db8:0:1::1", want: "ok"},
		}},
		{"below pressure idle connections stay", []step{
			{ip: "10.0.0.1", want: "ok"}, {ip: "10.0.0.2", want: "ok"}, {ip: "10.0.0.3", want: "ok"}, {ip: "10.0.0.4", want: "ok"},
			{ip: "10.0.0.5", at: time.Hour, want: "ok"},
		}},
		{"under pressure connections idle for the timeout are closed", []step{
			{ip: "10.0.0.1", want: "ok"}, {ip: "10.0.0.1", want: "ok"}, {ip: "10.0.0.2", want: "ok", busy: true},
			{ip: "10.0.0.3", want: "ok"}, {ip: "10.0.0.4", want: "ok"}, {ip: "10.0.0.5", want: "ok"},
			{ip: "10.0.0.6", at: 4 * time.Second, want: "ok"},
			{ip: "10.0.0.7", at: 5 * time.Second, want: "ok", stale: 5},
		}},
		{"at the cap with no idle connection, a new one is refused", []step{
			{ip: "10.0.0.1", busy: true, want: "ok"}, {ip: "10.0.0.2", busy: true, want: "ok"}, {ip: "10.0.0.3", busy: true, want: "ok"},
			{ip: "10.0.0.4", busy: true, want: "ok"}, {ip: "10.0.0.5", busy: true, want: "ok"}, {ip: "10.0.0.6", busy: true, want: "ok"},
			{ip: "10.0.0.7", busy: true, want: "ok"}, {ip: "10.0.0.8", want: "ok"},
			{ip: "10.0.0.9", at: time.Second, want: "full"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newL()
			for i, s := range tc.steps {
				sc, refusal, stale := l.admit(from(s.ip), t0.Add(s.at))
				got := "ok"
				switch {
				case sc == nil && strings.Contains(string(refusal), "from your address"):
					got = "source"
				case sc == nil:
					got = "full"
				}
				if got != s.want || len(stale) != s.stale {
					t.Fatalf("step %d (%s at %v): %s closing %d idle, want %s closing %d", i, s.ip, s.at, got, len(stale), s.want, s.stale)
				}
				if sc != nil && s.busy {
					sc.idleSince = time.Time{}
				}
			}
		})
	}
}

// TestCapListenerReleases: a closed connection gives its slot back to its source and
// to the cap, once even when closed twice (the server closes one the cap closed).
func TestCapListenerReleases(t *testing.T) {
	l := Listener(nil, Limits{MaxConnections: 2, MaxConnectionsPerSource: 1}).(*capListener)
	now := time.Now()
	a, _, _ := l.admit(from("127.0.0.1"), now)
	if a == nil {
		t.Fatal("the first connection was refused")
	}
	if sc, _, _ := l.admit(from("127.0.0.1"), now); sc != nil {
		t.Fatal("a second connection of the source was admitted past its cap of 1")
	}
	_ = a.Close()
	_ = a.Close()
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		if sc, _, _ := l.admit(from(ip), now); sc == nil {
			t.Errorf("after the close, %s was refused", ip)
		}
	}
	if len(l.sources) != 2 || len(l.conns) != 2 {
		t.Errorf("sources %v and %d connections, want one each of two sources", l.sources, len(l.conns))
	}
}

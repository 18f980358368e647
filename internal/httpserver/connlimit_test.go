package httpserver

import (
	"net"
	"slices"
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
// source, the global cap, under pressure the closing of connections idle for the
// pressure timeout, and at a cap the taking of a reclaimable connection's slot (idle,
// or waiting for its headers or body, the oldest first; never a busy one): its own
// source's at the source's cap, the largest source's at the global cap.
func TestCapListenerAdmit(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	newL := func(churn Limits) *capListener {
		return Listener(nil, Limits{MaxConnections: 8, MaxConnectionsPerSource: 3, PressureIdleTimeout: 5 * time.Second,
			DisplacementsPerSecond: churn.DisplacementsPerSecond, DisplacementBurst: churn.DisplacementBurst}).(*capListener)
	}
	// churn: at most 2 displacements at once, then one a second.
	churn := Limits{DisplacementsPerSecond: 1, DisplacementBurst: 2}
	type step struct {
		ip string
		at time.Duration
		// state the connection then takes: "" idle, "reused" (idle, 5 requests
		// answered), "once" (idle, 1 answered), "busy" (a request served),
		// "headers" (a request's headers begun, not ended), "body" (its handler waiting
		// for more of a body that came fast), "trickle" (the handler waiting, 10 bytes of
		// body come, the last 900 ms after it began).
		state string
		// want: "ok", "source" (refused by its source's cap), "full" (the global cap) or
		// "churn" (its source took slots faster than the listener allows);
		// stale: the steps whose connections it closed.
		want  string
		stale []int
	}
	for _, tc := range []struct {
		name  string
		churn Limits
		steps []step
	}{
		{"a source at its cap with busy connections is refused, another is not", Limits{}, []step{
			{ip: "127.0.0.1", state: "busy", want: "ok"}, {ip: "127.0.0.1", state: "busy", want: "ok"},
			{ip: "127.0.0.1", state: "busy", want: "ok"}, {ip: "127.0.0.1", want: "source"}, {ip: "127.0.0.2", want: "ok"},
		}},
		{"a source at its cap loses its own oldest idle connection", Limits{}, []step{
			{ip: "127.0.0.2", want: "ok"},
			{ip: "127.0.0.1", state: "busy", want: "ok"}, {ip: "127.0.0.1", at: time.Second, want: "ok"},
			{ip: "127.0.0.1", at: 2 * time.Second, want: "ok"}, {ip: "127.0.0.1", at: 3 * time.Second, want: "ok", stale: []int{2}},
			{ip: "127.0.0.1", at: 3 * time.Second, want: "ok", stale: []int{3}},
		}},
		{"an IPv6 /64 is one source", Limits{}, []step{
			{ip: "2001:db8::1", state: "busy", want: "ok"}, {ip: "2001:db8::2", state: "busy", want: "ok"},
			{ip: "2001:db8::ffff:1", state: "busy", want: "ok"},
			{ip: "2001:db8::3", want: "source"}, {ip: "2001:db8:0:1::1", want: "ok"},
		}},
		{"stalled headers and bodies are reclaimed oldest first, busy ones never", Limits{}, []step{
			{ip: "10.0.0.1", state: "busy", want: "ok"}, {ip: "10.0.0.1", state: "headers", want: "ok"},
			{ip: "10.0.0.1", at: 100 * time.Millisecond, state: "body", want: "ok"},
			{ip: "10.0.0.1", at: 500 * time.Millisecond, state: "busy", want: "ok", stale: []int{1}},
			{ip: "10.0.0.1", at: 600 * time.Millisecond, state: "busy", want: "ok", stale: []int{2}},
			{ip: "10.0.0.1", at: time.Hour, want: "source"},
		}},
		{"a body trickled below the minimum rate counts from its start", Limits{}, []step{
			{ip: "10.0.0.1", state: "busy", want: "ok"}, {ip: "10.0.0.1", at: 200 * time.Millisecond, state: "body", want: "ok"},
			{ip: "10.0.0.1", state: "trickle", want: "ok"},
			{ip: "10.0.0.1", at: time.Second, want: "ok", stale: []int{2}},
		}},
		{"below pressure idle connections stay", Limits{}, []step{
			{ip: "10.0.0.1", want: "ok"}, {ip: "10.0.0.2", want: "ok"}, {ip: "10.0.0.3", want: "ok"}, {ip: "10.0.0.4", want: "ok"},
			{ip: "10.0.0.5", at: time.Hour, want: "ok"},
		}},
		{"under pressure connections idle for the timeout are closed", Limits{}, []step{
			{ip: "10.0.0.1", want: "ok"}, {ip: "10.0.0.1", want: "ok"}, {ip: "10.0.0.2", want: "ok", state: "busy"},
			{ip: "10.0.0.3", want: "ok"}, {ip: "10.0.0.4", want: "ok"}, {ip: "10.0.0.5", want: "ok"},
			{ip: "10.0.0.6", at: 4 * time.Second, want: "ok"},
			{ip: "10.0.0.7", at: 5 * time.Second, want: "ok", stale: []int{0, 1, 3, 4, 5}},
		}},
		{"at the global cap the largest source loses its oldest idle connection", Limits{}, []step{
			{ip: "10.0.0.1", state: "busy", want: "ok"}, {ip: "10.0.0.2", want: "ok"},
			{ip: "10.0.0.3", at: time.Second, want: "ok"}, {ip: "10.0.0.3", at: 2 * time.Second, want: "ok"},
			{ip: "10.0.0.3", at: 3 * time.Second, want: "ok"},
			{ip: "10.0.0.4", at: 4 * time.Second, state: "busy", want: "ok"}, {ip: "10.0.0.5", state: "busy", want: "ok"},
			{ip: "10.0.0.6", state: "busy", want: "ok"},
			{ip: "10.0.0.7", at: 4 * time.Second, want: "ok", stale: []int{2}},
		}},
		{"at the cap with nothing reclaimable, a new one is refused", Limits{}, []step{
			{ip: "10.0.0.1", state: "busy", want: "ok"}, {ip: "10.0.0.2", state: "busy", want: "ok"},
			{ip: "10.0.0.3", state: "busy", want: "ok"}, {ip: "10.0.0.4", state: "busy", want: "ok"},
			{ip: "10.0.0.5", state: "busy", want: "ok"}, {ip: "10.0.0.6", state: "busy", want: "ok"},
			{ip: "10.0.0.7", state: "busy", want: "ok"}, {ip: "10.0.0.8", state: "busy", want: "ok"},
			{ip: "10.0.0.9", at: time.Hour, want: "full"},
		}},
		{"a connection answered more requests goes after those answered fewer", Limits{}, []step{
			{ip: "10.0.0.1", state: "reused", want: "ok"}, {ip: "10.0.0.1", at: time.Second, want: "ok"},
			{ip: "10.0.0.1", at: 2 * time.Second, state: "reused", want: "ok"},
			{ip: "10.0.0.1", at: 3 * time.Second, want: "ok", stale: []int{1}},
			{ip: "10.0.0.1", at: 4 * time.Second, want: "ok", stale: []int{3}},
			{ip: "10.0.0.1", at: 5 * time.Second, want: "ok", stale: []int{4}},
		}},
		{"a fresh connection goes before one answered twice, one answered once before both", Limits{}, []step{
			{ip: "10.0.0.1", state: "reused", want: "ok"},
			{ip: "10.0.0.1", at: 2 * time.Second, want: "ok"}, {ip: "10.0.0.1", at: 2100 * time.Millisecond, want: "ok"},
			{ip: "10.0.0.1", at: 2200 * time.Millisecond, want: "ok", stale: []int{1}},
			{ip: "10.0.0.1", at: 2300 * time.Millisecond, state: "once", want: "ok", stale: []int{2}},
			{ip: "10.0.0.1", at: 3400 * time.Millisecond, want: "ok", stale: []int{3}},
			{ip: "10.0.0.1", at: 3500 * time.Millisecond, want: "ok", stale: []int{4}},
		}},
		{"a source displaces its own connections at most its burst, then its rate", churn, []step{
			{ip: "10.0.0.1", want: "ok"}, {ip: "10.0.0.1", at: 100 * time.Microsecond, want: "ok"},
			{ip: "10.0.0.1", at: 200 * time.Microsecond, want: "ok"},
			{ip: "10.0.0.1", at: time.Millisecond, want: "ok", stale: []int{0}},
			{ip: "10.0.0.1", at: 2 * time.Millisecond, want: "ok", stale: []int{1}},
			{ip: "10.0.0.1", at: 3 * time.Millisecond, want: "churn"},
			{ip: "10.0.0.2", at: 4 * time.Millisecond, want: "ok"},
			{ip: "10.0.0.1", at: 900 * time.Millisecond, want: "churn"},
			{ip: "10.0.0.1", at: 1002 * time.Millisecond, want: "ok", stale: []int{2}},
			{ip: "10.0.0.1", at: 1003 * time.Millisecond, want: "churn"},
		}},
		{"a refusal of a source with nothing to displace takes none of its bucket", churn, []step{
			{ip: "10.0.0.1", state: "busy", want: "ok"}, {ip: "10.0.0.1", state: "busy", want: "ok"},
			{ip: "10.0.0.1", state: "busy", want: "ok"}, {ip: "10.0.0.1", want: "source"}, {ip: "10.0.0.1", want: "source"},
			{ip: "10.0.0.1", want: "source"},
		}},
		{"at the global cap a newcomer displaces within its own source's bucket", churn, []step{
			{ip: "10.0.0.1", want: "ok"}, {ip: "10.0.0.1", at: 100 * time.Microsecond, want: "ok"},
			{ip: "10.0.0.1", at: 200 * time.Microsecond, want: "ok"},
			{ip: "10.0.0.2", state: "busy", want: "ok"}, {ip: "10.0.0.2", state: "busy", want: "ok"}, {ip: "10.0.0.2", state: "busy", want: "ok"},
			{ip: "10.0.0.3", state: "busy", want: "ok"}, {ip: "10.0.0.3", state: "busy", want: "ok"},
			{ip: "10.0.0.4", at: time.Millisecond, want: "ok", stale: []int{0}},
			{ip: "10.0.0.4", at: 2 * time.Millisecond, want: "ok", stale: []int{1}},
			{ip: "10.0.0.4", at: 2 * time.Millisecond, want: "churn"},
			{ip: "10.0.0.5", at: 2 * time.Millisecond, want: "ok", stale: []int{8}},
		}},
		{"a source that closed all it held comes back with a full bucket", churn, []step{
			{ip: "10.0.0.1", want: "ok"}, {ip: "10.0.0.1", at: time.Millisecond, want: "ok"},
			{ip: "10.0.0.1", at: 2 * time.Millisecond, want: "ok"},
			{ip: "10.0.0.1", at: 3 * time.Millisecond, want: "ok", stale: []int{0}},
			{ip: "10.0.0.1", at: 4 * time.Millisecond, want: "ok", stale: []int{1}},
			{ip: "10.0.0.1", at: 5 * time.Millisecond, want: "churn"},
			{ip: "10.0.0.1", at: 6 * time.Millisecond, state: "close all", want: "churn"},
			{ip: "10.0.0.1", at: 7 * time.Millisecond, want: "ok"}, {ip: "10.0.0.1", at: 8 * time.Millisecond, want: "ok"},
			{ip: "10.0.0.1", at: 9 * time.Millisecond, want: "ok"},
			{ip: "10.0.0.1", at: 10 * time.Millisecond, want: "ok", stale: []int{7}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newL(tc.churn)
			var conns []*slotConn
			for i, s := range tc.steps {
				at := t0.Add(s.at)
				sc, refusal, stale := l.admit(from(s.ip), at)
				conns = append(conns, sc)
				got := "ok"
				switch {
				case sc == nil && strings.Contains(string(refusal), "a second"):
					got = "churn"
				case sc == nil && strings.Contains(string(refusal), "from your address"):
					got = "source"
				case sc == nil:
					got = "full"
				}
				var closed []int
				for _, c := range stale {
					closed = append(closed, slices.Index(conns, c))
				}
				slices.Sort(closed)
				if got != s.want || !slices.Equal(closed, s.stale) {
					t.Fatalf("step %d (%s at %v): %s closing steps %v, want %s closing %v", i, s.ip, s.at, got, closed, s.want, s.stale)
				}
				if sc != nil {
					setState(sc, s.state, at)
				}
				if s.state == "close all" {
					for _, c := range conns {
						if c != nil {
							_ = c.Close()
						}
					}
				}
			}
		})
	}
}

// setState puts sc in state (TestCapListenerAdmit's) at at.
func setState(sc *slotConn, state string, at time.Time) {
	switch state {
	case "reused": // idle, after 5 requests answered
		sc.served = 5
	case "once": // idle, after a request answered
		sc.served = 1
	case "busy":
		sc.idleSince, sc.activeSince, sc.handling = time.Time{}, at, true
	case "headers":
		sc.idleSince, sc.activeSince = time.Time{}, at
	case "body":
		sc.idleSince, sc.activeSince, sc.handling, sc.bodyStart, sc.waitSince, sc.bodyBytes = time.Time{}, at, true, at, at, 1<<20
	case "trickle":
		sc.idleSince, sc.activeSince, sc.handling, sc.bodyStart, sc.waitSince, sc.bodyBytes = time.Time{}, at, true, at, at.Add(900*time.Millisecond), 10
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
	a.idleSince, a.handling = time.Time{}, true // busy: not reclaimable
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
	if len(l.sources) != 2 || len(l.conns) != 2 || len(l.sources["127.0.0.1"]) != 1 {
		t.Errorf("sources %v and %d connections, want one each of two sources", l.sources, len(l.conns))
	}
}

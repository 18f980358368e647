package httpserver

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// echoBody is a handler that reads the request's body and answers "ok".
var echoBody = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if _, err := io.ReadAll(r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusRequestTimeout)
		return
	}
	_, _ = io.WriteString(w, "ok")
})

// dialFrom connects to addr from the local address ip (127.0.0.x on loopback).
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dialing from %s: %v", ip, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// clientFrom is an HTTP client whose connections come from ip, none kept alive.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// servedWithin polls a POST of the client to addr until it is answered 200 "ok", and
// says whether that happened within d (the last answer otherwise).
func servedWithin(c *http.Client, addr string, d time.Duration) (bool, string) {
	deadline := time.Now().Add(d)
	last := ""
	for time.Now().Before(deadline) {
		resp, err := c.Post("http://"+addr+"/", "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			last = err.Error()
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && string(b) == "ok" {
				return true, ""
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false, last
}

// TestAttackIdleConnectionsLockOutTheirSource: one local process opens the source's
// share of idle connections (on `macfleet serve` every client is 127.0.0.1, one
// source); another local client must still be served at once — the newcomer takes
// the slot of the oldest idle connection instead of being refused.
func TestAttackIdleConnectionsLockOutTheirSource(t *testing.T) {
	const perSource = 16
	addr := serve(t, echoBody, Limits{MaxConnections: 4 * perSource, MaxConnectionsPerSource: perSource})
	for range 2 * perSource {
		dialFrom(t, "127.0.0.1", addr)
	}
	if ok, last := servedWithin(clientFrom("127.0.0.1"), addr, 3*time.Second); !ok {
		t.Fatalf("with %d idle connections of another local process open, a local client was not served in 3s: %s", 2*perSource, last)
	}
}

// TestAttackStalledBodiesHoldTheirSource: one local process fills the source's share
// with requests whose headers came and whose body never does (or trickles a byte
// every 100 ms), each held for the whole body timeout by its handler reading the
// body, or — sent to a Host the guard does not answer to — by the server discarding
// the body of the refusal; once every one is taken up, another local client must be
// served at once, not after that timeout.
func TestAttackStalledBodiesHoldTheirSource(t *testing.T) {
	for _, tc := range []struct {
		name, host string
		trickle    bool
	}{{"read, half trickled", "127.0.0.1", true}, {"refused by the guard", "evil.example", false}} {
		t.Run(tc.name, func(t *testing.T) { stalledBodies(t, tc.host, tc.trickle) })
	}
}

// stalledBodies is TestAttackStalledBodiesHoldTheirSource's attack of bodies sent to
// host, half of them trickled when trickle is set.
func stalledBodies(t *testing.T, host string, trickle bool) {
	const perSource = 16
	var entered atomic.Int64
	hosts, err := NewHosts("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	guarded := Guard(echoBody, hosts)
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		guarded.ServeHTTP(w, r)
	}), Limits{MaxConnections: 4 * perSource, MaxConnectionsPerSource: perSource})
	var trickled []net.Conn
	for i := range perSource {
		c := dialFrom(t, "127.0.0.1", addr)
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", host)
		if trickle && i%2 == 0 {
			trickled = append(trickled, c)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for entered.Load() < perSource {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d stalled requests reached the handler in 5s", entered.Load(), perSource)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for _, c := range trickled {
				_, _ = c.Write([]byte(" "))
			}
		}
	}()
	if ok, last := servedWithin(clientFrom("127.0.0.1"), addr, 3*time.Second); !ok {
		t.Fatalf("with %d stalled bodies open, a client of their source was not served in 3s: %s", perSource, last)
	}
}

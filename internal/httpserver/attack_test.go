package httpserver

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
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

// TestAttackRedialFloodChurnsItsSource: one local process, its share of connections
// held, dials again and again as fast as it can (each new connection sends a request
// and stays kept alive, as a flood that redials every connection the server closes).
// Before the bound on displacements every one took the slot of the source's oldest
// idle connection: the server served a request and closed a connection per dial,
// as fast as the attacker dialled. Now past its burst the source's new connections
// take slots at most DefaultDisplacementsPerSecond a second; the others are refused
// at once with a 503 naming that rate.
func TestAttackRedialFloodChurnsItsSource(t *testing.T) {
	const perSource, dials = 16, 600
	var served atomic.Int64
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		_, _ = io.WriteString(w, "ok")
	}), Limits{MaxConnections: 4 * perSource, MaxConnectionsPerSource: perSource})
	start := time.Now()
	refused, named := 0, ""
	for i := range dials {
		c := dialFrom(t, "127.0.0.1", addr)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			refused++
			named = string(b)
			c.Close()
		}
		_ = c.SetDeadline(time.Time{})
	}
	elapsed := time.Since(start)
	allowed := perSource + DefaultDisplacementBurst + int64(DefaultDisplacementsPerSecond*elapsed.Seconds()) + 1
	t.Logf("%d dials in %v: %d requests served, %d refused", dials, elapsed.Round(time.Millisecond), served.Load(), refused)
	if served.Load() > allowed {
		t.Errorf("the server served %d of the flood's %d connections in %v, want at most %d (its share, the burst and %d a second)",
			served.Load(), dials, elapsed.Round(time.Millisecond), allowed, DefaultDisplacementsPerSecond)
	}
	if !strings.Contains(named, "too_many_connections") || !strings.Contains(named, "a second") {
		t.Errorf("the flood's refusals were %q, want the 503 naming the rate of new connections from one address", named)
	}
}

// TestAttackRedialFloodClosesAKeptAliveClient: on `macfleet serve` every local client
// is 127.0.0.1, one source. A client keeps its connection alive (as the SDKs do),
// sends two requests and waits while another local process fills the rest of the
// source's share with idle connections (each answered one request); then the client
// sends a request every 300 ms while that process redials as fast as it can. Before,
// each new connection of the flood took the oldest idle slot — first the client's,
// then cycling the whole share in tens of milliseconds, the client's connection
// closed under it again and again. Now the flood displaces at most its burst and
// then 16 a second, and of the idle connections those answered fewest requests first:
// the client's stays, every request served on the one connection.
func TestAttackRedialFloodClosesAKeptAliveClient(t *testing.T) {
	const perSource, dials = 128, 2000
	addr := serve(t, echoBody, Limits{MaxConnections: 4 * perSource, MaxConnectionsPerSource: perSource})
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, Timeout: 5 * time.Second}
	flood := func(n int) {
		for range n {
			c, err := dialer.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(func() { c.Close() })
			fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable {
					c.Close()
				}
			}
		}
	}
	c := newKeptAlive(t, addr, dialer)
	flood(perSource - 1) // the client's connection, idle meanwhile, is now the oldest
	stop := c.every(300 * time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { flood(dials / 4) })
	}
	wg.Wait()
	if fs, dialled := stop(); len(fs) > 0 || dialled != 1 {
		t.Errorf("through a flood of %d new connections from its address the kept-alive client dialled %d connections, want 1; "+
			"%d of its requests failed (the first: %v)", dials, dialled, len(fs), fs)
	}
}

// keptAlive is a client that keeps one connection alive, as the SDKs do.
type keptAlive struct {
	t       *testing.T
	addr    string
	client  *http.Client
	dialled atomic.Int64
}

// newKeptAlive is a kept-alive client of addr dialling with dialer, which has sent two
// requests, both answered, on its one connection.
func newKeptAlive(t *testing.T, addr string, dialer *net.Dialer) *keptAlive {
	t.Helper()
	c := &keptAlive{t: t, addr: addr}
	c.client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1,
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			c.dialled.Add(1)
			return dialer.DialContext(ctx, network, a)
		}}}
	t.Cleanup(c.client.CloseIdleConnections)
	for range 2 {
		if fail := c.send(); fail != "" {
			t.Fatalf("before the flood: %s", fail)
		}
	}
	return c
}

// send posts a request: "" when answered 200, else what went wrong.
func (c *keptAlive) send() string {
	resp, err := c.client.Post("http://"+c.addr+"/", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		return err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	return ""
}

// every sends a request each period until stop, which returns what failed and how
// many connections the client dialled in all.
func (c *keptAlive) every(period time.Duration) (stop func() ([]string, int64)) {
	done, fails := make(chan struct{}), make(chan []string, 1)
	go func() {
		var fs []string
		defer func() { fails <- fs }()
		for {
			select {
			case <-done:
				return
			case <-time.After(period):
			}
			if fail := c.send(); fail != "" {
				fs = append(fs, fail)
			}
		}
	}()
	return func() ([]string, int64) {
		close(done)
		return <-fails, c.dialled.Load()
	}
}

package gateway_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/internal/httpserver"
)

// raiseFileLimit lifts the process's soft limit of open files to at least n (within
// the hard limit), or skips nothing and fails the test when it cannot.
func raiseFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		t.Fatalf("the hard limit of open files is %d; this attack needs %d", lim.Max, n)
	}
	old := lim.Cur
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lim.Cur = old
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	})
}

// from is an HTTP client whose connections leave from the loopback address ip.
func from(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

// TestAttackIdleConnectionsLockEveryoneOut: one process at 127.0.0.1 opens 1,100
// connections to the gateway's API listener and keeps each alive after one
// GET /healthz. Before the cap per source, the first 1,024 filled the server's cap
// and a legitimate client at 127.0.0.2 was answered 503 until they were released.
// Now the attacker holds at most a quarter of the cap: past it each new connection
// takes the slot of its own source's oldest idle one, which the server closes, until
// the source has displaced its burst (then 16 a second): the rest are refused within
// a second, the refusal naming the cap per source; and the other client's request is
// served.
func TestAttackIdleConnectionsLockEveryoneOut(t *testing.T) {
	const attempts = 1100
	raiseFileLimit(t, 2*attempts+1024) // both ends of each connection live in this process
	e := cluster(t)
	g := startGateway(t, e, gateway.Config{})
	addr := strings.TrimPrefix(g.url, "http://")
	perSource := httpserver.DefaultMaxConnections / httpserver.DefaultSourceShare

	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused, slowest, unnamed := 0, time.Duration(0), ""
	for i := range attempts {
		if ctx.Err() != nil {
			t.Fatalf("%d connections opened in 90 s", i)
		}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		start := time.Now()
		status, body, err := healthz(c)
		switch {
		case err != nil:
			c.Close()
			t.Fatalf("connection %d: %v", i, err)
		case status == http.StatusServiceUnavailable:
			c.Close()
			refused++
			slowest = max(slowest, time.Since(start))
			if !strings.Contains(body, "too_many_connections") || !strings.Contains(body, "from your address") {
				unnamed = body
			}
		default:
			held = append(held, c) // kept alive, idle
		}
	}
	open := stillOpen(held)
	t.Logf("the attacker holds %d idle connections of %d answered, %d refused (slowest refusal %v)", open, len(held), refused, slowest)
	if open > perSource {
		t.Errorf("one source holds %d connections, want at most %d", open, perSource)
	}
	if unnamed != "" {
		t.Errorf("a connection refused with %q, want the cap per source named", unnamed)
	}
	if slowest > time.Second {
		t.Errorf("a refusal took %v, want under a second", slowest)
	}

	legit := from("127.0.0.2")
	resp, err := legit.Get(g.url + "/v1/models")
	if err != nil {
		t.Fatalf("another client's request: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("another client's request while one source holds %d idle connections: %d %s, want 200", len(held), resp.StatusCode, b)
	}
}

// stillOpen is how many of conns the server has not closed: on each, a read that
// waits half a second instead of failing at once. The reads run side by side, each
// with its own deadline set as it starts: a read begun after a deadline passed fails
// with that deadline before it looks at the socket, so a shared deadline counted
// connections the server had closed as open once the loop ran past it.
func stillOpen(conns []net.Conn) int {
	var open atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
				open.Add(1)
			}
			_ = c.SetReadDeadline(time.Time{})
		})
	}
	wg.Wait()
	return int(open.Load())
}

// healthz sends GET /healthz on c, keeping it alive, and reads the answer.
func healthz(c net.Conn) (int, string, error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n"); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

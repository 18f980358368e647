package httpserver

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// TestAttackStalledFloodClosesAKeptAliveClient: a client keeps one connection alive
// (two requests answered, then one every 300 ms) while another local process opens
// stalled request bodies as fast as it can for 3 s (headers and one byte each, then
// nothing; at most 20,000). Every stalled connection is reclaimable, and each younger
// than a second is fresh: before, a fresh unanswered connection went after every
// other, so with the flood's all fresh, each new one took the client's idle slot, its
// connection closed under it. Now a connection answered twice or more goes after the
// fresh ones: the client's stays, every request served on the one connection.
func TestAttackStalledFloodClosesAKeptAliveClient(t *testing.T) {
	const perSource, maxDials = 64, 20000
	addr := serve(t, echoBody, Limits{MaxConnections: 4 * perSource, MaxConnectionsPerSource: perSource})
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, Timeout: 5 * time.Second}
	c := newKeptAlive(t, addr, dialer)
	stop := c.every(300 * time.Millisecond)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	end := time.Now().Add(3 * time.Second)
	for range 4 {
		wg.Go(func() {
			for range maxDials / 4 {
				if time.Now().After(end) {
					return
				}
				nc, err := dialer.Dial("tcp", addr)
				if err != nil {
					continue // the listen queue is full: dial again
				}
				fmt.Fprint(nc, "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
				mu.Lock()
				conns = append(conns, nc)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if fs, dialled := stop(); len(fs) > 0 || dialled != 1 {
		t.Errorf("beside %d stalled bodies dialled from its address in 3s the kept-alive client dialled %d connections, want 1; "+
			"%d of its requests failed (the first: %v)", len(conns), dialled, len(fs), fs)
	}
}

package httpserver

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// refuseTimeout bounds the time spent on a refused connection.
const refuseTimeout = time.Second

// maxRefusing bounds the refusals in progress at once, each a goroutine that waits
// up to refuseTimeout for the client to read its answer; past it Accept writes the
// refusal and closes the connection itself (refuseNow).
const maxRefusing = 64

// Listener caps the connections open on ln (none when l.MaxConnections is negative):
//
//   - at most l.MaxConnectionsPerSource from one source address (an IPv6 address's
//     /64), so that one client cannot hold every slot;
//   - under pressure, when three quarters of l.MaxConnections are open, a new
//     connection first closes the connections that have waited idle (kept alive
//     after an answer, or not yet sent a first request) for l.PressureIdleTimeout;
//   - at either cap, a new connection takes the slot of a reclaimable connection
//     (evict.go): idle, or waiting for its client's request headers or body, the
//     one waiting longest first. At its source's cap it takes its own source's; at
//     the global cap the one of the source holding the most connections. So idle and
//     stalled connections never lock anyone out: the caps bound only connections
//     busy with a request.
//   - a source's new connections take slots at most l.DisplacementsPerSecond a
//     second (a bucket of l.DisplacementBurst, displace.go): past it, at a cap, a new
//     connection of that source is refused instead (written and closed at once,
//     refuseNow), so that one redialling as fast as it is closed costs the server a
//     written refusal, not a request served and a connection closed each;
//   - past a cap with nothing reclaimable, a new connection is answered "503 Service
//     Unavailable" with Retry-After and an OpenAI-shaped error body that names the
//     cap, then closed; the connections already open are served as before.
//
// Serve it with a server from New, whose ConnState tells the listener which
// connections are idle. Wrap the TCP listener, beneath any TLS
// (tls.NewListener(Listener(ln, l), cfg)): the HTTP server recognizes a TLS
// connection by its type, which a wrapper above TLS hides.
func Listener(ln net.Listener, l Limits) net.Listener {
	l = l.WithDefaults()
	if l.MaxConnections < 0 {
		return ln
	}
	perSource := l.MaxConnectionsPerSource
	if perSource < 0 || perSource > l.MaxConnections {
		perSource = l.MaxConnections
	}
	churn := newDisplacements(l.DisplacementsPerSecond, l.DisplacementBurst)
	return &capListener{Listener: ln, max: l.MaxConnections, perSource: perSource, pressureIdle: l.PressureIdleTimeout,
		refusal: Refusal(l.MaxConnections), sourceRefusal: sourceRefusal(perSource),
		churn: churn, churnRefusal: churnRefusal(l.MaxConnections, perSource, churn), refusing: make(chan struct{}, maxRefusing),
		sources: map[string]map[*slotConn]struct{}{}, conns: map[*slotConn]struct{}{}}
}

// Refusal is the whole HTTP response a connection past a cap of max gets.
func Refusal(max int) []byte {
	return refusal("this server already holds its limit of " + strconv.Itoa(max) + " open connections; retry shortly")
}

// sourceRefusal is the response of a connection past the cap of max from its source.
func sourceRefusal(max int) []byte {
	return refusal("this server already holds its limit of " + strconv.Itoa(max) +
		" open connections from your address; close idle ones or reuse them, then retry")
}

func refusal(msg string) []byte {
	body := `{"error":{"message":"` + msg + `","type":"service_unavailable","param":null,"code":"too_many_connections"}}` + "\n"
	return []byte(fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"+
		"Connection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
}

type capListener struct {
	net.Listener
	max, perSource         int
	pressureIdle           time.Duration
	refusal, sourceRefusal []byte
	churnRefusal           []byte
	// refusing holds a token per refusal in progress (refuse): past maxRefusing a
	// refusal is written and closed by Accept itself.
	refusing chan struct{}

	mu    sync.Mutex
	churn *displacements
	// sources holds each source's open connections.
	sources map[string]map[*slotConn]struct{}
	conns   map[*slotConn]struct{}
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		sc, refusal, stale := l.admit(c, time.Now())
		for _, s := range stale {
			_ = s.Conn.Close() // the server sees its read fail and closes it, releasing its slot
		}
		if sc != nil {
			return sc, nil
		}
		if l.churnRefusal != nil && &refusal[0] == &l.churnRefusal[0] {
			// A source past its displacement rate is a flood: the cheapest answer.
			refuseNow(c, refusal)
			continue
		}
		select {
		case l.refusing <- struct{}{}:
			go func() {
				refuse(c, refusal)
				<-l.refusing
			}()
		default:
			refuseNow(c, refusal)
		}
	}
}

// admit decides on c, accepted at now: its slot, or the refusal to answer. Under
// pressure it first takes the slots of the connections idle for pressureIdle; at a
// cap it takes the slot of a reclaimable connection (evict.go). The caller closes
// those it took.
func (l *capListener) admit(c net.Conn, now time.Time) (sc *slotConn, refusal []byte, stale []*slotConn) {
	src := Source(c.RemoteAddr())
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pressureIdle >= 0 && len(l.conns) >= l.max*3/4 {
		for s := range l.conns {
			if !s.idleSince.IsZero() && now.Sub(s.idleSince) >= l.pressureIdle {
				l.releaseLocked(s)
				stale = append(stale, s)
			}
		}
	}
	if len(l.sources[src]) >= l.perSource {
		if l.churn.spent(src, now) {
			return nil, l.churnRefusal, stale
		}
		v := oldestReclaimable(l.sources[src], now)
		switch {
		case v == nil:
			return nil, l.sourceRefusal, stale
		case !l.churn.allow(src, now):
			return nil, l.churnRefusal, stale
		}
		l.releaseLocked(v)
		stale = append(stale, v)
	}
	if len(l.conns) >= l.max {
		v := l.victimLocked(now)
		switch {
		case v == nil:
			return nil, l.refusal, stale
		case !l.churn.allow(src, now):
			return nil, l.churnRefusal, stale
		}
		l.releaseLocked(v)
		stale = append(stale, v)
	}
	sc = &slotConn{Conn: c, l: l, src: src, idleSince: now}
	l.conns[sc] = struct{}{}
	if l.sources[src] == nil {
		l.sources[src] = map[*slotConn]struct{}{}
	}
	l.sources[src][sc] = struct{}{}
	return sc, nil, stale
}

// releaseLocked gives s's slot back, once. l.mu is held.
func (l *capListener) releaseLocked(s *slotConn) {
	if _, ok := l.conns[s]; !ok {
		return
	}
	delete(l.conns, s)
	delete(l.sources[s.src], s)
	if len(l.sources[s.src]) == 0 {
		delete(l.sources, s.src)
		l.churn.forget(s.src)
	}
}

// Source is the address a connection from addr counts against: its IP, or for IPv6
// its /64 (one host holds a whole /64).
func Source(addr net.Addr) string {
	if a, ok := addr.(*net.TCPAddr); ok {
		return sourceOfIP(a.IP, addr.String())
	}
	return SourceOf(addr.String())
}

// SourceOf is Source of a "host:port" remote address (http.Request.RemoteAddr).
func SourceOf(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	return sourceOfIP(net.ParseIP(host), remote)
}

func sourceOfIP(ip net.IP, whole string) string {
	if ip4 := ip.To4(); ip4 != nil {
		return ip4.String()
	}
	if ip == nil {
		return whole
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// refuse answers c with the refusal and closes it; the request is drained first
// (briefly) so that closing does not reset the connection before the client read the
// answer.
func refuse(c net.Conn, refusal []byte) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseTimeout))
	if _, err := c.Write(refusal); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// refuseNow writes the refusal to c (a new connection's empty send buffer takes it
// whole), reads what the client already sent (drainReceived) and closes c without
// waiting: no goroutine, no wait for the client. A request that arrives after the
// close makes it a reset, after the answer was sent. Only floods get it: a source
// past its displacement rate, and refusals past maxRefusing at once.
func refuseNow(c net.Conn, refusal []byte) {
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
	_, _ = c.Write(refusal)
	drainReceived(c)
	_ = c.Close()
}

// drainReceived reads what c has already received, without waiting for more: a
// socket closed with unread bytes is reset at once, its unsent answer dropped, so a
// client that sent its request as it connected (before the accept) would read a reset
// instead of the refusal.
func drainReceived(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	var buf [4096]byte
	_ = rc.Read(func(fd uintptr) bool {
		for range 16 { // at most 64 KiB
			if n, err := syscall.Read(int(fd), buf[:]); n <= 0 || err != nil {
				break
			}
		}
		return true // one attempt: never wait for bytes not yet here
	})
}

// slotConn holds a slot of its listener until closed. Under the listener's lock:
// idleSince is when it last began to wait for a request (zero while one is read or
// served), activeSince when its current request's first byte arrived, handling
// whether a handler runs it, waitSince when that handler began to wait for body
// bytes that have not come (zero while it does not wait), bodyStart when the handler
// began and bodyBytes how much of its request's body came since; served counts the
// requests it was answered (evict.go lets the most used go last).
type slotConn struct {
	net.Conn
	l                                            *capListener
	src                                          string
	idleSince, activeSince, waitSince, bodyStart time.Time
	bodyBytes, served                            int64
	handling                                     bool
}

func (c *slotConn) Close() error {
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// update changes c's state under its listener's lock.
func (c *slotConn) update(f func(*slotConn)) {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	f(c)
}

// slotOf is the slotConn beneath c (a TLS connection's own), nil if none.
func slotOf(c net.Conn) *slotConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, _ := c.(*slotConn)
	return sc
}

// connState is the http.Server's ConnState hook of New: it marks a connection of a
// capListener idle while it waits for a request, busy once a request's first byte
// came.
func connState(c net.Conn, st http.ConnState) {
	sc := slotOf(c)
	if sc == nil {
		return
	}
	now := time.Now()
	sc.update(func(sc *slotConn) {
		switch st {
		case http.StateIdle:
			sc.idleSince, sc.handling, sc.waitSince = now, false, time.Time{}
			sc.served++
		case http.StateActive:
			sc.idleSince, sc.activeSince = time.Time{}, now
		}
	})
}

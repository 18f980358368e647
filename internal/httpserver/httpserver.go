// Package httpserver is what every HTTP server of macfleet applies against clients
// that hold it up or call it from where they should not: the gateway, the node agent
// (in a cluster and as `macfleet serve`), the manager's probes, metrics and node
// authorizer all build their http.Server here.
//
//   - Limits: a bound on reading the request headers and on reading the body, an idle
//     bound on kept-alive connections (shorter under pressure), and caps on open
//     connections, overall and per source address. There is no write timeout: a
//     stream lasts as long as generation does, and a global write deadline would cut
//     every long one. At a cap a new connection takes the slot of an idle or
//     stalled one, at a bounded rate per source (displace.go).
//   - Guard: which Host a server answers to (DNS rebinding) and refusal of a web
//     page's cross-origin requests (CSRF), for servers a browser can reach on a
//     developer's machine.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// Defaults of Limits.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultBodyTimeout bounds reading a request's body: 16 MiB (the largest body the
	// APIs take) needs only 2.2 Mbit/s to arrive in time.
	DefaultBodyTimeout = time.Minute
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxConnections caps the connections one server holds open.
	DefaultMaxConnections = 1024
	// DefaultSourceShare is the share of MaxConnections one source address may hold
	// when MaxConnectionsPerSource is unset: a quarter (256 of 1,024).
	DefaultSourceShare = 4
	// DefaultPressureIdleTimeout is how long a connection may wait idle once three
	// quarters of MaxConnections are open.
	DefaultPressureIdleTimeout = 5 * time.Second
	// DefaultDisplacementsPerSecond is how fast one source's new connections may
	// take the slots of open ones (at a cap) once DefaultDisplacementBurst is spent.
	DefaultDisplacementsPerSecond = 16
	// DefaultDisplacementBurst is how many slots one source's new connections may
	// take at once.
	DefaultDisplacementBurst = 64
)

// Limits bound what a client may hold of a server. Zero fields take the defaults; a
// negative one turns that bound off.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers (a client that trickles
	// them is cut).
	ReadHeaderTimeout time.Duration
	// BodyTimeout bounds reading a request's body, from the end of its headers. It is
	// a read deadline of that request only, lifted once the body is read, so that the
	// response — a stream of any length — is never cut by it.
	BodyTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that sends no next request.
	IdleTimeout time.Duration
	// MaxConnections caps the open connections: the next one is answered 503 with
	// Retry-After and closed, while the open ones are served as before.
	MaxConnections int
	// MaxConnectionsPerSource caps the open connections from one source address (an
	// IPv6 /64) the same way; unset, MaxConnections / DefaultSourceShare (at least
	// one). Behind a proxy every client shares the proxy's address: raise it, or turn
	// it off with a negative value.
	MaxConnectionsPerSource int
	// PressureIdleTimeout replaces IdleTimeout while three quarters of MaxConnections
	// are open: a new connection then closes those idle for it (kept alive after an
	// answer, or not yet sent a first request).
	PressureIdleTimeout time.Duration
	// DisplacementsPerSecond bounds how fast one source's new connections take the
	// slots of open ones at a cap (a token bucket of DisplacementBurst): past it, a
	// new connection of that source is refused at once instead of displacing, so a
	// source that redials as fast as it is closed gets 503s that cost a write, not a
	// request served and a connection closed each. Negative: no bound.
	DisplacementsPerSecond float64
	// DisplacementBurst is the bucket's size (negative: no bound).
	DisplacementBurst int
}

// WithDefaults fills the zero fields.
func (l Limits) WithDefaults() Limits {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&l.BodyTimeout, DefaultBodyTimeout)
	def(&l.IdleTimeout, DefaultIdleTimeout)
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxConnectionsPerSource == 0 {
		l.MaxConnectionsPerSource = max(l.MaxConnections/DefaultSourceShare, 1)
	}
	def(&l.PressureIdleTimeout, DefaultPressureIdleTimeout)
	if l.DisplacementsPerSecond == 0 {
		l.DisplacementsPerSecond = DefaultDisplacementsPerSecond
	}
	if l.DisplacementBurst == 0 {
		l.DisplacementBurst = DefaultDisplacementBurst
	}
	return l
}

// off is the value of a bound turned off.
func off(d time.Duration) time.Duration { return max(d, 0) }

// New is an http.Server for h within l (completed by WithDefaults). Serve it on
// Listen's listener (or one wrapped by Listener) so that the connection caps hold:
// its ConnState tells the listener which connections wait idle.
func New(h http.Handler, l Limits) *http.Server {
	l = l.WithDefaults()
	h = bodyDeadline(h, l.BodyTimeout)
	return &http.Server{Handler: h, ReadHeaderTimeout: off(l.ReadHeaderTimeout), IdleTimeout: off(l.IdleTimeout),
		ConnState: connState, ConnContext: withConn}
}

type connKey struct{}

// withConn is the http.Server's ConnContext hook of New: a request's context names
// its connection's slot, so that its handler tells the listener when it waits for a
// body that does not come.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if sc := slotOf(c); sc != nil {
		return context.WithValue(ctx, connKey{}, sc)
	}
	return ctx
}

// ErrBodyTimeout is what reading a request's body returns once BodyTimeout passed.
var ErrBodyTimeout = errors.New("the request body did not arrive in time")

// bodyDeadline marks the request's connection as handled until its handler returns,
// and sets a read deadline
// of d (none when d <= 0) on a request with a body, lifted once the body is read to
// its end or closed; while the handler waits for body bytes, the connection's slot
// knows since when (a stalled body is reclaimable, evict.go). A request without a
// body gets no deadline: its connection is already read in the background to notice
// the client leaving, and a deadline there would end the request.
func bodyDeadline(next http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, _ := r.Context().Value(connKey{}).(*slotConn)
		hasBody := r.Body != nil && r.Body != http.NoBody
		if sc != nil {
			now := time.Now()
			sc.update(func(sc *slotConn) { sc.handling, sc.bodyStart, sc.bodyBytes = true, now, 0 })
		}
		if hasBody {
			b := &deadlineBody{ReadCloser: r.Body, timeout: d, slot: sc, lift: func() {}}
			if rc := http.NewResponseController(w); d > 0 && rc.SetReadDeadline(time.Now().Add(d)) == nil {
				b.lift = sync.OnceFunc(func() { _ = rc.SetReadDeadline(time.Time{}) })
			}
			r.Body = b
		}
		next.ServeHTTP(w, r)
		if sc != nil {
			// What is left is the server discarding a body the handler did not read
			// (before it sends the answer), which a stalled client holds up: like
			// headers that do not end, that waits for the client.
			now := time.Now()
			sc.update(func(sc *slotConn) { sc.handling, sc.activeSince, sc.waitSince = false, now, time.Time{} })
		}
	})
}

type deadlineBody struct {
	io.ReadCloser
	timeout time.Duration
	lift    func()
	slot    *slotConn
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	if b.slot != nil {
		now := time.Now()
		b.slot.update(func(sc *slotConn) { sc.waitSince = now })
	}
	n, err := b.ReadCloser.Read(p)
	if b.slot != nil {
		b.slot.update(func(sc *slotConn) { sc.waitSince, sc.bodyBytes = time.Time{}, sc.bodyBytes+int64(n) })
	}
	switch {
	case err == io.EOF:
		b.lift()
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("%w (within %s)", ErrBodyTimeout, b.timeout)
	}
	return n, err
}

func (b *deadlineBody) Close() error {
	b.lift()
	return b.ReadCloser.Close()
}

// Listen listens on addr (tcp) with the connection cap of l.
func Listen(addr string, l Limits) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return Listener(ln, l), nil
}

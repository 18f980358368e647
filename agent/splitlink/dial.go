package splitlink

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// Dial opens the link to the worker shard of replica namespace/name at the agent
// listening on addr, over TLS with tlsCfg: the head Mac's client certificate, and a
// check that the agent is the worker's Mac (pki.Source.ClientConfig of its node
// identity). The connection returned carries the worker protocol's bytes.
func Dial(ctx context.Context, addr string, tlsCfg *tls.Config, namespace, name string) (net.Conn, error) {
	return Open(ctx, nil, addr, tlsCfg, Path(namespace, name))
}

// DialPeer opens the peer link to the worker shard of replica namespace/name at the
// agent listening on addr, as Dial does, from the Mac of the worker shard before it
// (tlsCfg: that Mac's client certificate).
func DialPeer(ctx context.Context, addr string, tlsCfg *tls.Config, namespace, name string) (net.Conn, error) {
	return Open(ctx, nil, addr, tlsCfg, PeerPath(namespace, name))
}

// DialFunc opens the connection a link's TLS runs over.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Open opens the link at path (Path, PeerPath) of the agent at addr over a connection
// that raw opens (a TCP connection to addr when nil; a Mac that dials out passes its
// tunnel's, which the gateway relays to the worker's Mac), with TLS by tlsCfg inside.
func Open(ctx context.Context, raw DialFunc, addr string, tlsCfg *tls.Config, path string) (net.Conn, error) {
	cfg := tlsCfg.Clone()
	cfg.NextProtos = []string{"http/1.1"} // an HTTP/2 stream cannot be upgraded
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultDialTimeout)
		defer cancel()
	}
	if raw == nil {
		raw = (&net.Dialer{}).DialContext
	}
	rc, err := raw(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("split link to %s: %w", addr, err)
	}
	if cfg.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	conn := tls.Client(rc, cfg)
	if err := conn.HandshakeContext(ctx); err != nil {
		rc.Close()
		return nil, fmt.Errorf("split link to %s: %w", addr, err)
	}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	req := "GET " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nConnection: Upgrade\r\nUpgrade: " + Protocol + "\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		conn.Close()
		return nil, fmt.Errorf("split link to %s: %w", addr, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("split link to %s: %w", addr, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		conn.Close()
		return nil, fmt.Errorf("split link to %s refused: %s: %s", addr, resp.Status, strings.TrimSpace(string(body)))
	}
	_ = conn.SetDeadline(time.Time{})
	return &bufferedConn{Conn: conn, r: br}, nil
}

// Forwarder is the head Mac's side: a loopback listener for the head's runner
// (--split-worker Addr()) that carries every connection over a link opened by dial.
// A link that cannot be opened closes the runner's connection, which the runner sees
// as an unreachable or lost worker. With a token (ForwardWithToken) a connection is
// carried only once its first frame is runnerapi.SplitAuthFrame(Token()), within
// TokenTimeout: any other process of the Mac that reaches the loopback port is not
// the head (the frame itself goes no further; the worker's agent opens the worker's
// side with the worker's own secret).
type Forwarder struct {
	ln    net.Listener
	dial  func(context.Context) (net.Conn, error)
	log   logr.Logger
	token []byte

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

// TokenTimeout is how long a connection to a Forwarder with a token has to present it.
const TokenTimeout = 10 * time.Second

// Forward listens on a free loopback port and forwards connections over dial until
// Close, to whoever connects (a test's runner; the agent uses ForwardWithToken).
func Forward(dial func(context.Context) (net.Conn, error), log logr.Logger) (*Forwarder, error) {
	return forward(dial, log, nil)
}

// ForwardWithToken is Forward for connections that open with the frame carrying a new
// random token of the Forwarder's (Token), given to the head's runner only.
func ForwardWithToken(dial func(context.Context) (net.Conn, error), log logr.Logger) (*Forwarder, error) {
	token := make([]byte, runnerapi.SplitSecretBytes)
	if _, err := rand.Read(token); err != nil {
		return nil, fmt.Errorf("making a split link's token: %w", err)
	}
	return forward(dial, log, token)
}

func forward(dial func(context.Context) (net.Conn, error), log logr.Logger, token []byte) (*Forwarder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for a split link: %w", err)
	}
	f := &Forwarder{ln: ln, dial: dial, log: log, token: token, conns: map[net.Conn]struct{}{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

// Addr is the loopback address the head's runner connects to.
func (f *Forwarder) Addr() string { return f.ln.Addr().String() }

// Token is what a connection must open with (runnerapi.SplitAuthFrame); nil when any
// connection is forwarded.
func (f *Forwarder) Token() []byte { return f.token }

// Close stops listening, ends every forwarded connection and waits for them.
func (f *Forwarder) Close() error {
	f.cancel()
	err := f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	return err
}

func (f *Forwarder) accept() {
	defer f.wg.Done()
	for {
		local, err := f.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				f.log.Error(err, "Accepting a split link connection")
			}
			return
		}
		if !f.track(local) {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(local)
			if err := f.authenticate(local); err != nil {
				f.log.Info("Refused a split link connection without the link's token", "from", local.RemoteAddr().String(), "err", err.Error())
				return
			}
			remote, err := f.dial(f.ctx)
			if err != nil {
				f.log.Info("Opening a split link failed; closing the runner's connection", "err", err.Error())
				return
			}
			if !f.track(remote) {
				remote.Close()
				return
			}
			defer f.untrack(remote)
			pipe(local, remote)
		}()
	}
}

// authenticate reads the token frame from a new connection when the Forwarder has a
// token, before anything is dialed.
func (f *Forwarder) authenticate(local net.Conn) error {
	if f.token == nil {
		return nil
	}
	_ = local.SetReadDeadline(time.Now().Add(TokenTimeout))
	if err := runnerapi.ReadSplitAuth(local, f.token); err != nil {
		return err
	}
	return local.SetReadDeadline(time.Time{})
}

// track remembers c for Close; false (and c closed) once closed.
func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx.Err() != nil {
		c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forwarder) untrack(c net.Conn) {
	c.Close()
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// pipe copies bytes both ways until either side ends, then closes both: the worker
// protocol has no half-closed state, and a worker lost must reach the runner at once.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	a.Close()
	b.Close()
	<-done
}

// bufferedConn is a connection whose first bytes were read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Package tunnel carries the fleet's calls to agents that dial out: a Mac behind an
// office NAT, which the gateway cannot reach at its advertised address, holds one
// connection to the gateway's tunnel listener instead, and the gateway opens a stream
// on it for each connection it would have dialed.
//
// The connection is mutual TLS: the agent shows its node certificate (the one it
// serves its API with), the gateway its own certificate for the agents. The gateway
// files the connection under the Mac the certificate names and no other (Admit), and
// uses it only for that Mac's backends. Streams are multiplexed by yamux
// (github.com/hashicorp/yamux), the multiplexer made for exactly this shape —
// connections initiated by the side that serves, streams opened by the other side,
// flow control per stream and keep-alive pings — so that one stalled stream never
// holds up another and a dead link is noticed.
//
// Above a stream nothing changes: the gateway speaks the same TLS to the agent's
// API as over a direct connection (the handshake still requires the Mac's
// certificate) and the same HTTP, so streaming, cancel by closing, stream
// continuation and keep-alives behave as they do for a reachable Mac.
//
// The agent opens a connection with one line, "macfleet-tunnel/1 NODE", naming the
// Mac it runs as; the gateway answers "ok" or "refused: REASON" (a certificate of
// another Mac, of no Mac, a malformed line) and closes.
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/macfleet/macfleet/internal/pki"
)

const (
	// Protocol is the first word of the agent's opening line.
	Protocol = "macfleet-tunnel/1"
	// maxLine bounds the opening line and the answer.
	maxLine = 512
	// HandshakeTimeout bounds the TLS handshake and the opening exchange.
	HandshakeTimeout = 10 * time.Second
	// KeepAliveInterval is how often each side pings the other: a link gone silent
	// (a Mac asleep, a NAT that dropped the mapping) is closed after about
	// ConnectionWriteTimeout more.
	KeepAliveInterval = 15 * time.Second
)

// ErrNoSession: the Mac holds no tunnel to this gateway.
var ErrNoSession = errors.New("no tunnel from this Mac")

// Admit decides which Mac a connection is from: the Mac its verified client
// certificate names, and only when the agent's opening line claims that same Mac.
// hasCert is false when the agent presented no certificate.
func Admit(id pki.Identity, hasCert bool, claim string) (string, error) {
	switch {
	case !hasCert:
		return "", errors.New("no client certificate: an agent dials out with its node certificate")
	case id.Kind != pki.KindNode:
		return "", fmt.Errorf("the certificate is a %s's (%s), not a Mac's", id.Kind, id.Name)
	case claim == "":
		return "", fmt.Errorf("the opening line names no Mac (want %q)", Protocol+" NODE")
	case claim != id.Name:
		return "", fmt.Errorf("the certificate is Mac %q's, the agent claims to be %q: run the agent with --node-name %s",
			id.Name, claim, id.Name)
	}
	return id.Name, nil
}

// sessionConfig is yamux's configuration on both sides: its log goes to w.
func sessionConfig(w io.Writer) *yamux.Config {
	c := yamux.DefaultConfig()
	c.KeepAliveInterval = KeepAliveInterval
	c.LogOutput = w
	return c
}

// stream is a yamux stream whose deadline errors are the standard library's
// (os.ErrDeadlineExceeded): yamux's is not Temporary, so a TLS connection on the
// stream took it for a broken link, and an HTTP server, which ends a pending read
// with a past deadline after every response, closed each kept-alive connection.
type stream struct{ net.Conn }

func (s stream) Read(b []byte) (int, error) {
	n, err := s.Conn.Read(b)
	return n, deadlineErr(err)
}

func (s stream) Write(b []byte) (int, error) {
	n, err := s.Conn.Write(b)
	return n, deadlineErr(err)
}

func deadlineErr(err error) error {
	if errors.Is(err, yamux.ErrTimeout) {
		return os.ErrDeadlineExceeded
	}
	return err
}

// listener is a session's streams as a listener of streams.
type listener struct{ *yamux.Session }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Session.Accept()
	if err != nil {
		return nil, err
	}
	return stream{c}, nil
}

// DialFunc is a transport's dial.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// dialVia is a transport's dial: through via to the Mac that nodeOf names in the
// request's context, else direct (no Mac named, or via answers ErrNoSession).
func dialVia(via func(ctx context.Context, node string) (net.Conn, error), nodeOf func(context.Context) string, direct DialFunc) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if node := nodeOf(ctx); node != "" {
			c, err := via(ctx, node)
			if !errors.Is(err, ErrNoSession) {
				return c, err
			}
		}
		return direct(ctx, network, addr)
	}
}

package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/macfleet/macfleet/internal/pki"
)

// The manager's reads of agents that dial out. The manager reaches a Mac that dials
// out through the gateway that holds the Mac's tunnel: it dials the gateway's tunnel
// listener with its own certificate and sends one line, "macfleet-relay/1 NODE"; the
// gateway answers "ok" and joins the connection to a stream of NODE's tunnel, "none"
// when NODE holds no tunnel to it (the manager then dials NODE's address), or
// "refused: REASON" for a certificate that is not the manager's or a gateway
// replica's. The manager's TLS with the agent runs inside the joined connection, so
// the agent still checks the manager's certificate and the manager the Mac's. Gateway
// replicas use the same line to reach each other's Macs (replicas.go).

// RelayProtocol is the first word of the manager's line asking for a Mac's tunnel.
const RelayProtocol = "macfleet-relay/1"

// AdmitRelay decides whether a caller may be joined to node's tunnel: only the
// manager or another gateway replica, with its certificate, and for a Mac named.
func AdmitRelay(id pki.Identity, hasCert bool, node string) error {
	switch {
	case !hasCert:
		return errors.New("no client certificate: only the manager and the gateway replicas are relayed to a Mac, with their certificate")
	case id.Kind != pki.KindManager && id.Kind != pki.KindGateway:
		return fmt.Errorf("the certificate is a %s's (%s): only the manager and the gateway replicas are relayed to a Mac", id.Kind, id.Name)
	case node == "":
		return fmt.Errorf("the line names no Mac (want %q)", RelayProtocol+" NODE")
	}
	return nil
}

// relayCaller answers an admitted relay line and joins c to node's tunnel: one held
// here, or, with throughReplicas (the manager's line), one another replica holds.
func (s *Sessions) relayCaller(ctx context.Context, c *tls.Conn, node string, throughReplicas bool) {
	defer c.Close()
	var peer net.Conn
	var err error
	if throughReplicas {
		peer, err = s.dialAny(ctx, node)
	} else {
		peer, err = s.Dial(node)
	}
	if err != nil {
		_, _ = io.WriteString(c, "none\n")
		return
	}
	defer peer.Close()
	if _, err := io.WriteString(c, "ok\n"); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	join(c, peer)
}

// Relay is the manager's way to the agents of Macs that dial out: through the tunnel
// listener of the gateway at Gateway, with Certificates (the manager's).
type Relay struct {
	Gateway      string
	Certificates *pki.Source
}

// Dial opens a connection to node's agent through the gateway; ErrNoSession when
// node holds no tunnel to it.
func (r *Relay) Dial(ctx context.Context, node string) (net.Conn, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: HandshakeTimeout}, Config: gatewayClientConfig(r.Certificates)}
	hctx, cancel := context.WithTimeout(ctx, HandshakeTimeout)
	defer cancel()
	c, err := d.DialContext(hctx, "tcp", r.Gateway)
	if err != nil {
		return nil, fmt.Errorf("dialing the gateway's tunnel at %s: %w", r.Gateway, err)
	}
	answer, err := func() (string, error) {
		_ = c.SetDeadline(time.Now().Add(HandshakeTimeout))
		if _, err := io.WriteString(c, RelayProtocol+" "+node+"\n"); err != nil {
			return "", err
		}
		return readLine(c)
	}()
	switch {
	case err != nil:
		err = fmt.Errorf("asking the gateway for Mac %q: %w", node, err)
	case answer == "none":
		err = ErrNoSession
	case answer != "ok":
		reason, _ := strings.CutPrefix(answer, "refused: ")
		err = &RefusedError{Reason: reason}
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// DialContext is a transport's dial: through the gateway to the Mac that nodeOf
// names in the request's context while it holds a tunnel there, else direct — also
// when the gateway cannot be reached (a Mac that dials out then fails at its
// address); a gateway's refusal is the error.
func (r *Relay) DialContext(nodeOf func(context.Context) string, direct DialFunc) DialFunc {
	return dialVia(func(ctx context.Context, node string) (net.Conn, error) {
		c, err := r.Dial(ctx, node)
		var refused *RefusedError
		if err != nil && !errors.As(err, &refused) {
			return nil, ErrNoSession
		}
		return c, err
	}, nodeOf, direct)
}

// Transports are the manager's transports to the agents (pki.Transports with
// Certificates) with DialContext's dial, direct dials at net/http's defaults.
func (r *Relay) Transports() *pki.Transports {
	return pki.NewTransports(r.Certificates, func() *http.Transport {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = r.DialContext(pki.NodeFrom, tr.DialContext)
		return tr
	})
}

package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/yamux"

	"github.com/macfleet/macfleet/internal/pki"
)

// Defaults of Agent's reconnect backoff.
const (
	DefaultMinBackoff = 500 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second
)

// Agent is the Mac's half: it dials the gateway's tunnel listener and serves its API
// on the connection until it drops, then dials again.
type Agent struct {
	// Gateway is the gateway's tunnel address (host:port).
	Gateway string
	// Node is the Mac this agent runs as; its certificate in Certificates must name it.
	Node string
	// Certificates are the Mac's node certificate and the fleet's CA bundle.
	Certificates *pki.Source
	// MinBackoff and MaxBackoff bound the wait between attempts (the defaults when
	// zero); the wait doubles after each failure and starts over after a tunnel that
	// was up.
	MinBackoff, MaxBackoff time.Duration
	// Advertised, with --connect auto, is the Mac's advertised address: the agent
	// holds a tunnel only while the gateway's probe does not reach it there
	// (ChooseOutbound), and asks again every ProbeEvery (ProbeInterval when zero).
	Advertised string
	ProbeEvery time.Duration
	Log        logr.Logger

	mu   sync.Mutex
	sess *yamux.Session // the tunnel up now, for DialPeer
}

// Run holds a tunnel until ctx ends: serve is called with each tunnel's listener
// (the gateway's streams) and returns when the tunnel closes.
func (a *Agent) Run(ctx context.Context, serve func(net.Listener) error) error {
	lo, hi := a.MinBackoff, a.MaxBackoff
	if lo <= 0 {
		lo = DefaultMinBackoff
	}
	if hi <= 0 {
		hi = DefaultMaxBackoff
	}
	wait, reached := lo, false
	for {
		if a.reachable(ctx, reached) {
			reached = true
			if !sleep(ctx, a.probeEvery()) {
				return nil
			}
			continue
		}
		reached = false
		sess, err := a.Connect(ctx)
		if err == nil {
			a.Log.Info("Connected to the gateway by tunnel", "gateway", a.Gateway)
			stop := context.AfterFunc(ctx, func() { sess.Close() })
			a.setSession(sess)
			err = serve(listener{sess})
			a.setSession(nil)
			stop()
			sess.Close()
			wait = lo
		}
		if ctx.Err() != nil {
			return nil
		}
		a.Log.Info("The tunnel to the gateway is down; dialing again", "gateway", a.Gateway, "in", wait, "reason", errString(err))
		if !sleep(ctx, wait) {
			return nil
		}
		wait = min(2*wait, hi)
	}
}

// reachable, with Advertised, asks the gateway to probe it: true when the agent
// needs no tunnel now. again says the last probe found it reachable too: the answer
// is then logged at level 1, not at every probe.
func (a *Agent) reachable(ctx context.Context, again bool) bool {
	if a.Advertised == "" {
		return false
	}
	ok, err := a.Probe(ctx, a.Advertised)
	if ChooseOutbound(ok, err) {
		if err != nil {
			a.Log.Info("Probing this Mac's address through the gateway failed; dialing out", "address", a.Advertised, "reason", err.Error())
		}
		return false
	}
	log := a.Log
	if again {
		log = log.V(1)
	}
	log.Info("The gateway reaches this Mac at its address; not dialing out", "address", a.Advertised, "again", a.probeEvery())
	return true
}

func (a *Agent) probeEvery() time.Duration {
	if a.ProbeEvery > 0 {
		return a.ProbeEvery
	}
	return ProbeInterval
}

// sleep waits d; false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (a *Agent) setSession(sess *yamux.Session) {
	a.mu.Lock()
	a.sess = sess
	a.mu.Unlock()
}

func errString(err error) string {
	if err == nil {
		return "closed"
	}
	return err.Error()
}

// Connect dials the gateway, proves the Mac and starts the multiplexer: the session
// is the listener of the gateway's streams.
func (a *Agent) Connect(ctx context.Context) (*yamux.Session, error) {
	c, err := a.dialGateway(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.open(c); err != nil {
		c.Close()
		return nil, err
	}
	sess, err := yamux.Server(c, sessionConfig(logWriter{a.Log}))
	if err != nil {
		c.Close()
		return nil, err
	}
	return sess, nil
}

// dialGateway dials the gateway's tunnel listener with the Mac's certificate.
func (a *Agent) dialGateway(ctx context.Context) (net.Conn, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: HandshakeTimeout, KeepAlive: 30 * time.Second}, Config: gatewayClientConfig(a.Certificates)}
	hctx, cancel := context.WithTimeout(ctx, HandshakeTimeout)
	defer cancel()
	c, err := d.DialContext(hctx, "tcp", a.Gateway)
	if err != nil {
		return nil, fmt.Errorf("dialing the gateway's tunnel at %s: %w", a.Gateway, err)
	}
	return c, nil
}

// open sends the opening line and reads the gateway's answer.
func (a *Agent) open(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(HandshakeTimeout))
	if _, err := io.WriteString(c, Protocol+" "+a.Node+"\n"); err != nil {
		return fmt.Errorf("opening the tunnel: %w", err)
	}
	answer, err := readLine(c)
	if err != nil {
		return fmt.Errorf("reading the gateway's answer: %w", err)
	}
	if answer != "ok" {
		reason, _ := strings.CutPrefix(answer, "refused: ")
		return &RefusedError{Reason: reason}
	}
	return c.SetDeadline(time.Time{})
}

// RefusedError: the gateway refused the tunnel, and why.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "the gateway refused the tunnel: " + e.Reason }

// gatewayClientConfig presents src's certificate (the Mac's, or the manager's) and
// accepts a gateway's certificate of the fleet CA (any gateway replica's name).
func gatewayClientConfig(src *pki.Source) *tls.Config {
	cfg := src.ClientConfig(pki.Identity{})
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		now := time.Now()
		if src.Now != nil {
			now = src.Now()
		}
		id, err := pki.Verify(cs.PeerCertificates, src.Roots(), now, x509.ExtKeyUsageServerAuth)
		if err != nil {
			return err
		}
		if id.Kind != pki.KindGateway {
			return errors.New("the tunnel's server shows a " + string(id.Kind) + "'s certificate, not a gateway's")
		}
		return nil
	}
	return cfg
}

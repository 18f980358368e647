package tunnel

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/macfleet/macfleet/internal/pki"
)

// The probe of --connect auto. Before it dials out, an agent asks the gateway whether
// the gateway reaches it at its advertised address: it dials the tunnel listener with
// its node certificate and sends one line, "macfleet-probe/1 ADDRESS"; the gateway
// dials ADDRESS, completes a TLS handshake that requires the certificate of the Mac
// the agent's own certificate names, closes, and answers "reachable" or, after
// ProbeTimeout whatever failed, "unreachable". The agent holds a tunnel unless it is reachable
// (ChooseOutbound). A probe shows a Mac nothing but whether its own listener answers
// there.

// ProbeProtocol is the first word of an agent's probe line.
const ProbeProtocol = "macfleet-probe/1"

// ProbeTimeout bounds the gateway's dial and handshake of a probe, and is when it
// answers one that failed.
const ProbeTimeout = 5 * time.Second

// ProbeInterval is how often an agent of --connect auto that the gateway reaches
// asks again (--tunnel-probe-interval): a Mac that stops answering at its address
// dials out within about this long. A probe costs the gateway one TLS handshake.
const ProbeInterval = 30 * time.Second

// MinProbeInterval is the shortest --tunnel-probe-interval: the gateway answers a
// probe that failed after ProbeTimeout.
const MinProbeInterval = ProbeTimeout

// ChooseOutbound decides --connect auto from the gateway's probe: hold a tunnel
// unless the gateway answered that it reaches the Mac's advertised address. A probe
// that failed (the gateway not reached, a gateway without probes) holds one too: the
// tunnel serves a Mac whether or not its address answers.
func ChooseOutbound(reachable bool, probeErr error) bool {
	return probeErr != nil || !reachable
}

// probe answers an agent's probe line: whether node's agent answers at addr. The
// answer "unreachable" carries no reason and comes ProbeTimeout after the line
// whatever failed, so that a Mac learns nothing of what else listens where the
// gateway dials (TestAttackTunnelProbeScansTheGatewaysNetwork); the gateway logs the
// reason.
func (s *Sessions) probe(ctx context.Context, c net.Conn, node, addr string) {
	defer c.Close()
	wait := s.ProbeWait
	if wait <= 0 {
		wait = ProbeTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	answer := "reachable"
	if err := s.reach(pctx, node, addr); err != nil {
		s.Log.V(1).Info("A Mac's probe did not reach it", "node", node, "address", addr, "reason", err.Error())
		<-pctx.Done()
		answer = "unreachable"
	}
	_, _ = io.WriteString(c, answer+"\n")
}

// reach dials addr and completes a TLS handshake requiring node's certificate.
func (s *Sessions) reach(ctx context.Context, node, addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("the address %q: want HOST:PORT", addr)
	}
	d := &tls.Dialer{Config: s.Certificates.ClientConfig(pki.Node(node))}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// Probe asks the gateway whether it reaches this Mac's agent at addr.
func (a *Agent) Probe(ctx context.Context, addr string) (bool, error) {
	c, err := a.dialGateway(ctx)
	if err != nil {
		return false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(HandshakeTimeout + ProbeTimeout))
	if _, err := io.WriteString(c, ProbeProtocol+" "+addr+"\n"); err != nil {
		return false, fmt.Errorf("asking the gateway to probe %s: %w", addr, err)
	}
	answer, err := readLine(c)
	switch {
	case err != nil:
		return false, fmt.Errorf("reading the gateway's probe of %s: %w", addr, err)
	case answer == "reachable":
		return true, nil
	case answer == "unreachable":
		a.Log.Info("The gateway does not reach this Mac at its address (the gateway's log at level 1 says why)", "address", addr)
		return false, nil
	}
	reason, _ := strings.CutPrefix(answer, "refused: ")
	return false, &RefusedError{Reason: reason}
}

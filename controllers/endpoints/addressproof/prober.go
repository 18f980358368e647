package addressproof

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/macfleet/macfleet/internal/pki"
)

// DefaultTimeout bounds one handshake: an agent answers in milliseconds; a listener
// that says nothing (a plain TCP service) is given up on quickly.
const DefaultTimeout = 3 * time.Second

// Prober proves Macs' agent addresses by TLS handshakes and keeps the last result of
// each Mac. It is safe for concurrent use.
type Prober struct {
	// Source is the manager's client certificate and the fleet CA bundle of the
	// moment (the handshake is pki.Source.ClientConfig's, for pki.Node(name)).
	Source *pki.Source
	// Policy: zero means DefaultPolicy.
	Policy Policy
	// Timeout bounds a handshake, dial included; zero means DefaultTimeout.
	Timeout time.Duration
	// Clock: nil means the real clock.
	Clock clock.PassiveClock

	mu      sync.Mutex
	results map[string]Result // by Mac name
}

// Verify judges the agent address addr of the Mac node, Ready since readySince,
// shaking hands with it when a proof is due (see Decide). probed says whether a
// handshake ran in this call (its failure is then news worth reporting; a verdict
// read from the cache is not).
func (p *Prober) Verify(ctx context.Context, node, addr string, readySince time.Time) (v Verdict, probed bool) {
	pol := p.policy()
	p.mu.Lock()
	last, ok := p.results[node]
	p.mu.Unlock()
	var lastp *Result
	if ok {
		lastp = &last
	}
	if v = Decide(pol, lastp, addr, readySince, p.now()); !v.Probe {
		return v, false
	}
	err := p.handshake(ctx, node, addr)
	res := Result{Address: addr, At: p.now(), Err: err}
	if err != nil {
		res.Failures = 1
		if lastp != nil && lastp.Address == addr && lastp.Err != nil {
			res.Failures = lastp.Failures + 1
		}
	}
	p.mu.Lock()
	if p.results == nil {
		p.results = map[string]Result{}
	}
	p.results[node] = res
	p.mu.Unlock()
	return Decide(pol, &res, addr, readySince, res.At), true
}

// handshake dials addr and requires the listener there to present the certificate of
// the Mac node from the fleet CA.
func (p *Prober) handshake(ctx context.Context, node, addr string) error {
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("dialing the agent: %w", err)
	}
	defer conn.Close()
	tc := tls.Client(conn, p.Source.ClientConfig(pki.Node(node)))
	if err := tc.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("the listener there did not prove it is %s: %w", pki.Node(node), err)
	}
	tc.Close()
	return nil
}

func (p *Prober) policy() Policy {
	if p.Policy == (Policy{}) {
		return DefaultPolicy
	}
	return p.Policy
}

func (p *Prober) now() time.Time {
	if p.Clock == nil {
		return time.Now()
	}
	return p.Clock.Now()
}

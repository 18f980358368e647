// Package addressproof tells whether a Mac's agent address is the Mac's own: the
// listener there must finish a TLS handshake with the certificate of exactly that
// Mac (from the fleet CA, naming macfleet://node/<name>). The endpoints controller
// publishes an address in tenants' EndpointSlices only once it is proven, so that a
// compromised Mac cannot send tenants' in-cluster callers (and their tokens) to
// another service of the cluster or the LAN.
//
// Decide is the pure decision (proven, to be probed, or refused until when); the
// Prober does the handshakes and keeps their results per Mac.
package addressproof

import (
	"fmt"
	"time"
)

// Policy is how long proofs last and how failed ones are retried.
type Policy struct {
	// TTL is how long a successful handshake proves an address; it is then proven
	// again (the Mac's certificate may have been revoked by a CA rotation, its
	// address taken over).
	TTL time.Duration
	// MinBackoff and MaxBackoff bound the wait before an address that failed is
	// probed again: MinBackoff after the first failure, doubling up to MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
}

// DefaultPolicy re-proves addresses every five minutes and retries failures after
// 1s, 2s, 4s, … up to a minute.
var DefaultPolicy = Policy{TTL: 5 * time.Minute, MinBackoff: time.Second, MaxBackoff: time.Minute}

// Result is the last handshake with one Mac's address.
type Result struct {
	// Address is the host:port probed.
	Address string
	// At is when the handshake ended.
	At time.Time
	// Err is why it did not prove the address; nil when it did.
	Err error
	// Failures counts the consecutive failed handshakes at Address.
	Failures int
}

// Verdict is what to do with an address now.
type Verdict struct {
	// Proven: the address may be published.
	Proven bool
	// Probe: a handshake is due (none yet at this address, the proof expired, or the
	// backoff after a failure elapsed).
	Probe bool
	// Why says why an address that is not proven is not (empty when Proven).
	Why string
	// RecheckAfter is when the verdict changes without a new event: the proof
	// expires or the backoff ends (0 when Probe).
	RecheckAfter time.Duration
}

// Decide judges the Mac's address addr at now from its last handshake last (nil
// when there was none). readySince is when the Mac last became Ready (zero:
// unknown): a failure before it says nothing of the agent that came up since, which
// is probed without waiting for the backoff.
func Decide(p Policy, last *Result, addr string, readySince, now time.Time) Verdict {
	if last == nil || last.Address != addr {
		return Verdict{Probe: true, Why: fmt.Sprintf("agent address %s is not verified yet", addr)}
	}
	age := now.Sub(last.At)
	if last.Err == nil {
		if age < p.TTL && age >= 0 {
			return Verdict{Proven: true, RecheckAfter: p.TTL - age}
		}
		return Verdict{Probe: true, Why: fmt.Sprintf("the proof of agent address %s expired", addr)}
	}
	why := fmt.Sprintf("agent address %s failed verification (%d times): %v", addr, last.Failures, last.Err)
	if wait := Backoff(p, last.Failures); age < wait && age >= 0 && !readySince.After(last.At) {
		return Verdict{Why: why, RecheckAfter: wait - age}
	}
	return Verdict{Probe: true, Why: why}
}

// Backoff is the wait after failures consecutive failed handshakes.
func Backoff(p Policy, failures int) time.Duration {
	if failures <= 0 {
		return 0
	}
	d := p.MinBackoff
	for i := 1; i < failures && d < p.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, p.MaxBackoff)
}

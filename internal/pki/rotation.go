package pki

import (
	"crypto/x509"
	"time"
)

// DefaultPropagation is how long a successor CA is trusted (published in the bundle)
// before it signs anything, so that every verifier has it by then.
const DefaultPropagation = time.Hour

// Rotation is the state of the fleet CA: Current signs, Next (once made) is trusted
// but does not sign yet, Previous (after a promotion) is trusted until it expires so
// that the certificates it signed stay good until they are renewed.
type Rotation struct {
	Current  *CA
	Next     *CA
	Previous *x509.Certificate
}

// Step is what the CA's keeper does next.
type Step string

// The steps of a rotation, in the order Plan checks them.
const (
	StepNone         Step = ""
	StepCreate       Step = "Create"       // no CA yet: make one
	StepDropPrevious Step = "DropPrevious" // the previous CA expired: stop trusting it
	StepPromote      Step = "Promote"      // the successor was published long enough: it signs now
	StepPrepareNext  Step = "PrepareNext"  // two thirds of the current CA's life passed: make its successor
)

// Plan decides the next step of r at now; propagation is how long a successor is
// published before it signs.
func Plan(r Rotation, now time.Time, propagation time.Duration) Step {
	switch {
	case r.Current == nil:
		return StepCreate
	case r.Previous != nil && !now.Before(r.Previous.NotAfter):
		return StepDropPrevious
	case r.Next != nil && !now.Before(published(r.Next).Add(propagation)):
		return StepPromote
	case r.Next == nil && !now.Before(RenewAt(r.Current.Cert)):
		return StepPrepareNext
	}
	return StepNone
}

// published is when a CA was made (NewCA backdates NotBefore).
func published(ca *CA) time.Time { return ca.Cert.NotBefore.Add(backdate) }

// NextCheck is when Plan may next decide something other than StepNone.
func NextCheck(r Rotation, propagation time.Duration) time.Time {
	var at []time.Time
	if r.Current != nil && r.Next == nil {
		at = append(at, RenewAt(r.Current.Cert))
	}
	if r.Next != nil {
		at = append(at, published(r.Next).Add(propagation))
	}
	if r.Previous != nil {
		at = append(at, r.Previous.NotAfter)
	}
	var first time.Time
	for _, t := range at {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	return first
}

// Apply performs step on r (making keys for StepCreate and StepPrepareNext) and
// returns the new state.
func Apply(r Rotation, step Step, now time.Time, lifetime time.Duration) (Rotation, error) {
	switch step {
	case StepCreate:
		ca, err := NewCA(now, lifetime)
		if err != nil {
			return r, err
		}
		return Rotation{Current: ca}, nil
	case StepDropPrevious:
		r.Previous = nil
	case StepPromote:
		r.Previous, r.Current, r.Next = r.Current.Cert, r.Next, nil
	case StepPrepareNext:
		ca, err := NewCA(now, lifetime)
		if err != nil {
			return r, err
		}
		r.Next = ca
	}
	return r, nil
}

// Bundle is every CA certificate a verifier trusts: the current, the successor and the
// previous one.
func (r Rotation) Bundle() []*x509.Certificate {
	var out []*x509.Certificate
	for _, ca := range []*CA{r.Current, r.Next} {
		if ca != nil {
			out = append(out, ca.Cert)
		}
	}
	if r.Previous != nil {
		out = append(out, r.Previous)
	}
	return out
}

// Pool is a CertPool of certs.
func Pool(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// Package csrcleanup says when the certificate signer deletes a
// CertificateSigningRequest of macfleet.dev/node: every agent asks for a new
// certificate at two thirds of the old one's lifetime, and a stolen credential may
// ask as often as it likes, so requests would pile up in the API server without it.
package csrcleanup

import (
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
)

// Retention is how long requests are kept after they were created, by state.
type Retention struct {
	// Issued requests hold a certificate the agent took within its wait (at most
	// minutes); past this they serve only as a record.
	Issued time.Duration
	// Refused (Denied or Failed) requests are kept longer, so that whoever looks
	// finds the reason (an attack, a Mac that lost its key).
	Refused time.Duration
	// Pending requests (neither issued nor refused) were abandoned by their agent,
	// which asks again after its wait.
	Pending time.Duration
}

// DefaultRetention: an hour for issued requests, a day for refused and pending ones.
var DefaultRetention = Retention{Issued: time.Hour, Refused: 24 * time.Hour, Pending: 24 * time.Hour}

// Decide says whether csr is due for deletion at now, and if not, how long until it
// is (the signer looks again then).
func Decide(csr *certv1.CertificateSigningRequest, now time.Time, r Retention) (remove bool, after time.Duration) {
	keep := r.Pending
	switch {
	case has(csr, certv1.CertificateDenied) || has(csr, certv1.CertificateFailed):
		keep = r.Refused
	case len(csr.Status.Certificate) > 0:
		keep = r.Issued
	}
	left := csr.CreationTimestamp.Add(keep).Sub(now)
	if left <= 0 {
		return true, 0
	}
	return false, left
}

func has(csr *certv1.CertificateSigningRequest, t certv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

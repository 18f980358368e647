package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"
)

// IssueServing signs a certificate that serves HTTPS for hosts (DNS names, a
// "*.example.com" wildcard, or IP addresses) over pub: server auth only and no
// identity URI, so no check of the fleet's identities (Verify, IdentityOf) accepts it
// as a Mac, a gateway, the manager or a scraper, and it cannot call an agent. It is
// valid from now for lifetime and never beyond the CA. The gateway's own HTTPS
// listener takes it where no other issuer serves the cluster.
func (ca *CA) IssueServing(pub crypto.PublicKey, hosts []string, now time.Time, lifetime time.Duration) (*x509.Certificate, error) {
	if err := ValidHosts(hosts); err != nil {
		return nil, err
	}
	tmpl, err := ca.leafTemplate(pub, now, lifetime)
	if err != nil {
		return nil, err
	}
	if len(hosts[0]) <= 64 { // the subject's upper bound; clients read the names from the SANs
		tmpl.Subject = pkix.Name{CommonName: hosts[0]}
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, strings.ToLower(h))
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing the serving certificate of %s: %w", strings.Join(hosts, ", "), err)
	}
	return x509.ParseCertificate(der)
}

// ValidHosts checks the names a serving certificate is issued for: at least one, each
// an IP address or a DNS name (letters, digits, hyphens and dots; a leading "*." at
// most), none twice.
func ValidHosts(hosts []string) error {
	if len(hosts) == 0 {
		return errors.New("a serving certificate needs at least one host name or address")
	}
	seen := map[string]bool{}
	for _, h := range hosts {
		key := strings.ToLower(h)
		if seen[key] {
			return fmt.Errorf("host %q is named twice", h)
		}
		seen[key] = true
		if net.ParseIP(h) != nil {
			continue
		}
		if err := validDNSName(strings.TrimPrefix(key, "*.")); err != nil {
			return fmt.Errorf("host %q: %w", h, err)
		}
	}
	return nil
}

func validDNSName(name string) error {
	if name == "" || len(name) > 253 {
		return errors.New("not a DNS name (1 to 253 characters)")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("not a DNS name (labels of 1 to 63 characters, no leading or trailing hyphen)")
		}
		for _, r := range label {
			if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
				return fmt.Errorf("not a DNS name (%q is not a letter, digit or hyphen)", r)
			}
		}
	}
	return nil
}

// ServesExactly reports whether c is a serving certificate (IssueServing) for
// exactly hosts, in any order: a changed list of hosts makes the issuer renew it.
func ServesExactly(c *x509.Certificate, hosts []string) bool {
	if len(c.URIs) > 0 || len(c.EmailAddresses) > 0 {
		return false
	}
	var got, want []string
	for _, n := range c.DNSNames {
		got = append(got, strings.ToLower(n))
	}
	for _, ip := range c.IPAddresses {
		got = append(got, ip.String())
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			want = append(want, ip.String())
		} else {
			want = append(want, strings.ToLower(h))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	return slices.Equal(got, want)
}

// Package pki is the fleet's certificate authority: the identities that call and serve
// the node agents' API (a Mac, a gateway, the manager), the fleet CA that the manager
// keeps and rotates, the certificates it issues, and the checks every peer makes.
//
// Everything here is a pure function of its inputs and the time it is given: the
// manager (internal/casigner) and the agent (agent/certs) do the reads and writes.
//
// An identity is one URI SAN, macfleet://<kind>/<name>: macfleet://node/mac-1 is the
// Mac whose MacNode is mac-1, macfleet://gateway/<pod> a gateway replica,
// macfleet://manager/<name> the manager, macfleet://metrics/<name> a scraper of the
// agents' /metrics (Prometheus). Keys are ECDSA P-256.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"strings"
	"time"
)

const (
	// NodeSignerName is the signerName of the CertificateSigningRequests through which
	// an agent gets its certificate; the manager signs them (internal/casigner).
	NodeSignerName = "macfleet.dev/node"
	// URIScheme is the scheme of the identity URI SANs.
	URIScheme = "macfleet"
	// DefaultLeafLifetime is the lifetime of the certificates of agents, gateways and
	// the manager; they renew at two thirds of it (RenewAt).
	DefaultLeafLifetime = 24 * time.Hour
	// DefaultCALifetime is the lifetime of a fleet CA; a successor is made at two
	// thirds of it (Plan).
	DefaultCALifetime = 365 * 24 * time.Hour
	// backdate absorbs clock skew between the issuer and its verifiers.
	backdate = 5 * time.Minute
)

// Kind is what an identity is.
type Kind string

// The kinds of identity.
const (
	KindNode    Kind = "node"
	KindGateway Kind = "gateway"
	KindManager Kind = "manager"
	// KindMetrics scrapes the agents' /metrics and may call nothing else.
	KindMetrics Kind = "metrics"
)

// Identity is who a certificate names.
type Identity struct {
	Kind Kind
	Name string
}

// Node is the identity of the Mac whose MacNode is name.
func Node(name string) Identity { return Identity{Kind: KindNode, Name: name} }

// Gateway is the identity of a gateway replica.
func Gateway(name string) Identity { return Identity{Kind: KindGateway, Name: name} }

// Manager is the identity of the manager.
func Manager(name string) Identity { return Identity{Kind: KindManager, Name: name} }

// Metrics is the identity of a scraper of the agents' /metrics.
func Metrics(name string) Identity { return Identity{Kind: KindMetrics, Name: name} }

// URI is the identity's URI SAN.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: URIScheme, Host: string(id.Kind), Path: "/" + id.Name}
}

func (id Identity) String() string { return id.URI().String() }

// Valid says why id cannot be put in a certificate, or nil.
func (id Identity) Valid() error {
	switch id.Kind {
	case KindNode, KindGateway, KindManager, KindMetrics:
	default:
		return fmt.Errorf("unknown identity kind %q", id.Kind)
	}
	if id.Name == "" || len(id.Name) > 253 || strings.ContainsAny(id.Name, "/?#%@: ") {
		return fmt.Errorf("identity name %q is not a Kubernetes object name", id.Name)
	}
	return nil
}

// ParseIdentity reads a macfleet:// URI.
func ParseIdentity(u *url.URL) (Identity, error) {
	if u == nil || u.Scheme != URIScheme || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return Identity{}, fmt.Errorf("%v is not a %s:// identity", u, URIScheme)
	}
	id := Identity{Kind: Kind(u.Host), Name: strings.TrimPrefix(u.Path, "/")}
	if err := id.Valid(); err != nil {
		return Identity{}, fmt.Errorf("%v: %w", u, err)
	}
	return id, nil
}

// IdentityOf is the identity a certificate names: exactly one macfleet:// URI SAN and
// no other name.
func IdentityOf(c *x509.Certificate) (Identity, error) {
	if len(c.URIs) != 1 || len(c.DNSNames)+len(c.IPAddresses)+len(c.EmailAddresses) > 0 {
		return Identity{}, fmt.Errorf("certificate %q must name exactly one %s:// URI and nothing else", c.Subject.CommonName, URIScheme)
	}
	return ParseIdentity(c.URIs[0])
}

// NewKey makes a P-256 key.
func NewKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

// EncodeKey is key in PEM (PKCS #8).
func EncodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseKey reads a PEM key that EncodeKey (or an EC/PKCS #8 encoder) wrote.
func ParseKey(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM block in the key")
	}
	if k, err := x509.ParseECPrivateKey(blk.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing the key: %w", err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("the key is a %T, not ECDSA", k)
	}
	return ek, nil
}

// EncodeCerts is certs in PEM, one block each.
func EncodeCerts(certs ...*x509.Certificate) []byte {
	var b []byte
	for _, c := range certs {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return b
}

// ParseCerts reads every CERTIFICATE block of b; it fails on none.
func ParseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing a certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no certificate in the PEM data")
	}
	return out, nil
}

// CA is a fleet CA: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA makes a self-signed CA valid from now for lifetime.
func NewCA(now time.Time, lifetime time.Duration) (*CA, error) {
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "macfleet fleet CA " + now.UTC().Format("2006-01-02T15:04:05Z")},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("creating the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// ParseCA reads a CA from PEM; the key must match the certificate.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	certs, err := ParseCerts(certPEM)
	if err != nil {
		return nil, err
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	pub, ok := certs[0].PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(key.Public()) {
		return nil, errors.New("the CA key does not match its certificate")
	}
	if !certs[0].IsCA {
		return nil, errors.New("the CA certificate is not a CA")
	}
	return &CA{Cert: certs[0], Key: key}, nil
}

// Issue signs a certificate for id over pub, usable to serve and to call (server and
// client auth), valid from now for lifetime and never beyond the CA.
func (ca *CA) Issue(pub crypto.PublicKey, id Identity, now time.Time, lifetime time.Duration) (*x509.Certificate, error) {
	if err := id.Valid(); err != nil {
		return nil, err
	}
	tmpl, err := ca.leafTemplate(pub, now, lifetime)
	if err != nil {
		return nil, err
	}
	tmpl.Subject = pkix.Name{CommonName: id.Name, OrganizationalUnit: []string{string(id.Kind)}}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tmpl.URIs = []*url.URL{id.URI()}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing the certificate of %s: %w", id, err)
	}
	return x509.ParseCertificate(der)
}

// leafTemplate is what every certificate ca issues over pub has: a new serial, valid
// from now (backdated for skew) for lifetime and never beyond the CA, for signatures.
func (ca *CA) leafTemplate(pub crypto.PublicKey, now time.Time, lifetime time.Duration) (*x509.Certificate, error) {
	if _, ok := pub.(*ecdsa.PublicKey); !ok {
		return nil, fmt.Errorf("the key to certify is a %T, not ECDSA", pub)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(lifetime)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	return &x509.Certificate{SerialNumber: serial, NotBefore: now.Add(-backdate), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature}, nil
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// NewCSR is a certificate request for id over key, in PEM.
func NewCSR(key *ecdsa.PrivateKey, id Identity) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: id.Name}, URIs: []*url.URL{id.URI()},
	}, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// CheckCSR parses a PEM certificate request and says why it may not be signed for
// want: its signature must hold, its key be ECDSA, and it must name want and nothing
// else (one URI SAN, and a common name that is empty or want's name).
func CheckCSR(csrPEM []byte, want Identity) (*x509.CertificateRequest, error) {
	blk, _ := pem.Decode(csrPEM)
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("the request holds no PEM CERTIFICATE REQUEST")
	}
	csr, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing the certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the certificate request's signature: %w", err)
	}
	if _, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok {
		return nil, fmt.Errorf("the certificate request's key is a %T, not ECDSA P-256", csr.PublicKey)
	}
	if len(csr.URIs) != 1 || csr.URIs[0].String() != want.String() ||
		len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses) > 0 {
		return nil, fmt.Errorf("the certificate request must name exactly %s and nothing else (it names URIs %v, DNS %v, IPs %v, emails %v)",
			want, csr.URIs, csr.DNSNames, csr.IPAddresses, csr.EmailAddresses)
	}
	if cn := csr.Subject.CommonName; cn != "" && cn != want.Name {
		return nil, fmt.Errorf("the certificate request's common name %q is not %q", cn, want.Name)
	}
	return csr, nil
}

// RenewAt is when a certificate valid over [notBefore, notAfter] is renewed: at two
// thirds of its lifetime.
func RenewAt(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// Verify checks a peer's chain against roots at now for usage and returns the
// identity its leaf names.
func Verify(chain []*x509.Certificate, roots *x509.CertPool, now time.Time, usage x509.ExtKeyUsage) (Identity, error) {
	if len(chain) == 0 {
		return Identity{}, errors.New("no certificate presented")
	}
	if roots == nil {
		return Identity{}, errors.New("no fleet CA bundle is known yet")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return Identity{}, fmt.Errorf("the certificate of %q is not from the fleet CA: %w", chain[0].Subject.CommonName, err)
	}
	return IdentityOf(chain[0])
}

// VerifyServer checks that a server's chain is from the fleet CA and names exactly
// want: a Mac other than the one meant, or any other host, is refused.
func VerifyServer(chain []*x509.Certificate, roots *x509.CertPool, now time.Time, want Identity) error {
	got, err := Verify(chain, roots, now, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("the server is %s, not %s", got, want)
	}
	return nil
}

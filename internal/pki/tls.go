package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Source holds a peer's current certificate and the fleet's trust bundle, both
// replaced while connections use them (renewal, CA rotation). The zero Source has
// neither: servers refuse handshakes and clients present nothing.
type Source struct {
	cert  atomic.Pointer[tls.Certificate]
	roots atomic.Pointer[x509.CertPool]
	// Now is the clock of the checks; nil means time.Now.
	Now func() time.Time
}

// SetCertificate installs a certificate (PEM, leaf first) and its key.
func (s *Source) SetCertificate(certPEM, keyPEM []byte) error {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("the certificate and key: %w", err)
	}
	s.cert.Store(&c)
	return nil
}

// NewSource is a Source trusting ca and holding a new key with a certificate of ca
// for id, valid from now for lifetime; with a nil id it holds no certificate (a
// caller that only checks servers).
func (ca *CA) NewSource(id *Identity, now time.Time, lifetime time.Duration) (*Source, error) {
	s := &Source{}
	s.roots.Store(Pool([]*x509.Certificate{ca.Cert}))
	if id == nil {
		return s, nil
	}
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	c, err := ca.Issue(key.Public(), *id, now, lifetime)
	if err != nil {
		return nil, err
	}
	s.cert.Store(&tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: key, Leaf: c})
	return s, nil
}

// Certificate is the current certificate, or nil.
func (s *Source) Certificate() *tls.Certificate { return s.cert.Load() }

// SetBundle installs the trust bundle (PEM CA certificates).
func (s *Source) SetBundle(bundlePEM []byte) error {
	certs, err := ParseCerts(bundlePEM)
	if err != nil {
		return fmt.Errorf("the fleet CA bundle: %w", err)
	}
	s.roots.Store(Pool(certs))
	return nil
}

// Roots is the current trust bundle, or nil.
func (s *Source) Roots() *x509.CertPool { return s.roots.Load() }

func (s *Source) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

var errNoCertificate = errors.New("no certificate yet")

// ServerConfig serves with the current certificate and asks callers for a client
// certificate: one that is not from the fleet CA fails the handshake; none at all is
// allowed (a tenant's ServiceAccount token over TLS), and PeerIdentity then says so.
func (s *Source) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if c := s.cert.Load(); c != nil {
				return c, nil
			}
			return nil, errNoCertificate
		},
		ClientAuth: tls.RequestClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return nil
			}
			_, err := Verify(cs.PeerCertificates, s.roots.Load(), s.now(), x509.ExtKeyUsageClientAuth)
			return err
		},
	}
}

// PeerIdentity is the identity of a TLS peer whose handshake ServerConfig checked,
// and false when it presented no certificate.
func PeerIdentity(cs *tls.ConnectionState) (Identity, bool) {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return Identity{}, false
	}
	id, err := IdentityOf(cs.PeerCertificates[0])
	return id, err == nil
}

// ClientConfig calls the server want with the current certificate: the server must
// present a certificate of the fleet CA that names exactly want (the Mac meant, not
// whatever answers at its address), or the handshake fails before a byte of the
// request is sent.
func (s *Source) ClientConfig(want Identity) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain and the name are checked in VerifyConnection, against the bundle of
		// the moment and the identity rather than a host name.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c := s.cert.Load(); c != nil {
				return c, nil
			}
			return &tls.Certificate{}, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			return VerifyServer(cs.PeerCertificates, s.roots.Load(), s.now(), want)
		},
	}
}

// Transports are HTTP transports to the node agents, one per Mac so that a pooled
// connection verified for one Mac never carries a request meant for another.
type Transports struct {
	src *Source
	// New makes the base transport of a Mac (its TLSClientConfig is replaced).
	newBase func() *http.Transport
	mu      sync.Mutex
	byNode  map[string]*http.Transport
}

// NewTransports makes the transports of src; newBase makes each Mac's base transport
// (nil: http.DefaultTransport's settings).
func NewTransports(src *Source, newBase func() *http.Transport) *Transports {
	if newBase == nil {
		newBase = func() *http.Transport { return http.DefaultTransport.(*http.Transport).Clone() }
	}
	return &Transports{src: src, newBase: newBase, byNode: map[string]*http.Transport{}}
}

// For is the transport to the agent of node.
func (t *Transports) For(node string) *http.Transport {
	t.mu.Lock()
	defer t.mu.Unlock()
	tr, ok := t.byNode[node]
	if !ok {
		tr = t.newBase()
		tr.TLSClientConfig = t.src.ClientConfig(Node(node))
		t.byNode[node] = tr
	}
	return tr
}

type nodeKey struct{}

// WithNode names the Mac whose agent a request made with ctx is meant for; the
// Transports' RoundTrip requires it.
func WithNode(ctx context.Context, node string) context.Context {
	return context.WithValue(ctx, nodeKey{}, node)
}

// NodeFrom is the Mac that WithNode named in ctx, or "".
func NodeFrom(ctx context.Context) string {
	node, _ := ctx.Value(nodeKey{}).(string)
	return node
}

// RoundTrip sends req over the transport of the Mac its context names (WithNode).
func (t *Transports) RoundTrip(req *http.Request) (*http.Response, error) {
	node := NodeFrom(req.Context())
	if node == "" {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("a request to the agent at %s names no Mac to verify it against", req.URL.Host)
	}
	return t.For(node).RoundTrip(req)
}

// CloseIdleConnections closes the idle connections to every Mac.
func (t *Transports) CloseIdleConnections() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tr := range t.byNode {
		tr.CloseIdleConnections()
	}
}

package localfleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
)

// The agents serve TLS with certificates of the fleet CA that the manager keeps:
// tests call them as a gateway would (Fleet.AgentHTTP, a certificate of the gateway
// identity "e2e"), as a tenant would (no certificate, a ServiceAccount token) or as
// an attacker holding a Mac's certificate (AgentClient with a node identity).

// fleetCA reads the fleet CA from its Secret, waiting for the manager to make it.
func (f *Fleet) fleetCA(ctx context.Context) (*pki.CA, error) {
	var ca *pki.CA
	err := Poll(ctx, time.Minute, func() (bool, error) {
		var s corev1.Secret
		if err := f.Client.Get(ctx, client.ObjectKey{Namespace: v1alpha1.SystemNamespace, Name: v1alpha1.CASecret}, &s); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		var err error
		ca, err = pki.ParseCA(s.Data["ca.crt"], s.Data["ca.key"])
		return err == nil, err
	}, func() string { return "the manager's fleet CA (Secret macfleet-system/macfleet-ca)" })
	return ca, err
}

// AgentClient is an HTTP client for the agents (https://<addr>) presenting a
// certificate of id issued from the fleet CA, or none when id is nil. It checks that
// the agent's certificate is from the fleet CA and names a Mac, any Mac: tests
// address agents by their address.
func (f *Fleet) AgentClient(ctx context.Context, id *pki.Identity) (*http.Client, error) {
	ca, err := f.fleetCA(ctx)
	if err != nil {
		return nil, err
	}
	src, err := ca.NewSource(id, time.Now(), pki.DefaultLeafLifetime)
	if err != nil {
		return nil, err
	}
	return f.AgentClientWith(ctx, src.Certificate())
}

// AgentClientWith is AgentClient presenting cert (none when nil): for example a
// Mac's own certificate, as an attacker who took the Mac holds it.
func (f *Fleet) AgentClientWith(ctx context.Context, cert *tls.Certificate) (*http.Client, error) {
	ca, err := f.fleetCA(ctx)
	if err != nil {
		return nil, err
	}
	roots := pki.Pool([]*x509.Certificate{ca.Cert})
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, //nolint:gosec // checked in VerifyConnection against the fleet CA
		VerifyConnection: func(cs tls.ConnectionState) error {
			got, err := pki.Verify(cs.PeerCertificates, roots, time.Now(), x509.ExtKeyUsageServerAuth)
			if err == nil && got.Kind != pki.KindNode {
				err = fmt.Errorf("the agent's certificate names %s, not a Mac", got)
			}
			return err
		},
	}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return &http.Client{Transport: tr}, nil
}

// AgentURL is the base URL of the agent API at addr (host:port).
func AgentURL(addr string) string { return "https://" + addr }

package certsigner

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/callercert"
	"github.com/macfleet/macfleet/internal/pki"
)

// callerSecret is one client certificate the authority keeps in a Secret of
// macfleet-system for a caller of the agents that runs apart from the manager.
type callerSecret struct {
	secret string
	id     pki.Identity
	// who names the caller in logs and errors.
	who string
	// hosts, when set, make it a serving certificate for them (pki.IssueServing)
	// instead of one of id.
	hosts []string
	// digestKey: the Secret also holds the prefix-digest key every gateway replica
	// shares (callercert.DigestKeyData), made once and kept through renewals.
	digestKey bool
}

// matches: the certificate is what c keeps (a renamed caller, or a changed list of
// hosts, gets a new one).
func (c callerSecret) matches(cert *x509.Certificate) bool {
	if len(c.hosts) > 0 {
		return pki.ServesExactly(cert, c.hosts)
	}
	return names(cert, c.id)
}

// callerSecrets are the Secrets Sync keeps: the gateway's (the whole agent API) and
// the metrics scraper's (the agents' /metrics only), each when its name is set.
func (a *Authority) callerSecrets() []callerSecret {
	var out []callerSecret
	if a.GatewayName != "" {
		out = append(out, callerSecret{secret: mfv1.GatewayTLSSecret, id: pki.Gateway(a.GatewayName), who: "the gateway", digestKey: true})
	}
	if a.MetricsName != "" {
		out = append(out, callerSecret{secret: mfv1.MetricsTLSSecret, id: pki.Metrics(a.MetricsName), who: "the metrics scraper"})
	}
	if a.GatewayServingSecret != "" {
		out = append(out, callerSecret{secret: a.GatewayServingSecret, hosts: a.GatewayServingHosts, who: "the gateway's HTTPS listener"})
	}
	return out
}

// ensureCallerSecrets keeps every caller's Secret (ensureCallerSecret) and returns
// when the first is next due (zero: none).
func (a *Authority) ensureCallerSecrets(ctx context.Context, bundle []byte) (time.Time, error) {
	var due time.Time
	for _, c := range a.callerSecrets() {
		renew, err := a.ensureCallerSecret(ctx, c, bundle)
		if err != nil {
			return time.Time{}, err
		}
		due = earliest(due, renew)
	}
	return due, nil
}

// ensureCallerSecret renews c's certificate when due (or signed by a CA that no
// longer signs, or naming another identity) and keeps its bundle current; it returns
// when it is next due.
func (a *Authority) ensureCallerSecret(ctx context.Context, c callerSecret, bundle []byte) (time.Time, error) {
	key := types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: c.secret}
	sec := &corev1.Secret{}
	err := a.Client.Get(ctx, key, sec)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return time.Time{}, fmt.Errorf("reading the Secret of %s %s: %w", c.who, key, err)
	}
	a.mu.RLock()
	current := a.rotation.Current.Cert
	a.mu.RUnlock()
	var renewAt time.Time
	if certs, err := pki.ParseCerts(sec.Data[corev1.TLSCertKey]); err == nil && signedBy(certs[0], current) && c.matches(certs[0]) {
		renewAt = pki.RenewAt(certs[0])
	}
	fresh := !renewAt.IsZero() && a.Clock.Now().Before(renewAt)
	digestKey := keptDigestKey(c, sec.Data)
	if fresh && string(sec.Data[mfv1.CABundleKey]) == string(bundle) && string(digestKey) == string(sec.Data[callercert.DigestKeyData]) {
		return renewAt, nil
	}
	if digestKey == nil && c.digestKey {
		if digestKey, err = newDigestKey(); err != nil {
			return time.Time{}, err
		}
		a.Log.Info("Made the prefix-digest key the gateways share", "secret", key.String())
	}
	if !fresh {
		certPEM, keyPEM, err := a.issueFor(c)
		if err != nil {
			return time.Time{}, err
		}
		sec.Data = map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}
		certs, _ := pki.ParseCerts(certPEM)
		renewAt = pki.RenewAt(certs[0])
	}
	sec.Data[mfv1.CABundleKey] = bundle
	if digestKey != nil {
		sec.Data[callercert.DigestKeyData] = digestKey
	}
	if exists {
		err = a.Client.Update(ctx, sec)
	} else {
		sec.ObjectMeta = metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Labels: map[string]string{"app.kubernetes.io/part-of": "macfleet"}}
		sec.Type = corev1.SecretTypeTLS
		err = a.Client.Create(ctx, sec)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("writing the Secret of %s %s: %w", c.who, key, err)
	}
	a.Log.Info("Issued a caller's certificate", "caller", c.who, "identity", c.id.String(), "hosts", c.hosts, "secret", key.String(), "renewAt", renewAt)
	return renewAt, nil
}

// keptDigestKey is the prefix-digest key in data that c keeps: the one there when it
// is well formed, nil when c keeps none or there is none to keep.
func keptDigestKey(c callerSecret, data map[string][]byte) []byte {
	if k := data[callercert.DigestKeyData]; c.digestKey && len(k) == callercert.DigestKeySize {
		return k
	}
	return nil
}

// newDigestKey makes a prefix-digest key.
func newDigestKey() ([]byte, error) {
	k := make([]byte, callercert.DigestKeySize)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("making the prefix-digest key: %w", err)
	}
	return k, nil
}

// names: the certificate names exactly id (a renamed caller gets a new one).
func names(c *x509.Certificate, id pki.Identity) bool {
	got, err := pki.IdentityOf(c)
	return err == nil && got == id
}

// issueFor makes a key and c's certificate from the signing CA.
func (a *Authority) issueFor(c callerSecret) (certPEM, keyPEM []byte, err error) {
	if len(c.hosts) == 0 {
		return a.issueNew(c.id)
	}
	key, err := pki.NewKey()
	if err != nil {
		return nil, nil, err
	}
	a.mu.RLock()
	ca := a.rotation.Current
	a.mu.RUnlock()
	if ca == nil {
		return nil, nil, errors.New("the fleet CA is not loaded yet")
	}
	cert, err := ca.IssueServing(key.Public(), c.hosts, a.Clock.Now(), a.LeafLifetime)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing the certificate of %s: %w", c.who, err)
	}
	kp, err := pki.EncodeKey(key)
	return pki.EncodeCerts(cert), kp, err
}

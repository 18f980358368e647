// Package certsigner is the manager's certificate authority for the data plane: it
// keeps the fleet CA in a Secret and rotates it (pki.Plan), publishes the CA bundle
// that every agent and caller trusts in a ConfigMap, signs the agents'
// CertificateSigningRequests (signerName macfleet.dev/node) when the requester is the
// node identity the request names, and issues the client certificates of the
// gateway, of the metrics scraper and of the manager itself.
package certsigner

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
)

// Keys of the CA Secret.
const (
	keyCACert   = "ca.crt"
	keyCAKey    = "ca.key"
	keyNextCert = "next.crt"
	keyNextKey  = "next.key"
	keyPrevCert = "previous.crt"
)

// DefaultResync bounds how long the authority waits between checks of its Secrets
// (a deleted or edited one is restored within it).
const DefaultResync = 5 * time.Minute

// The CA Secret, the bundle ConfigMap, the gateway's and the scraper's Secrets, in macfleet-system.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update,namespace=macfleet-system
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update,namespace=macfleet-system

// Authority keeps the fleet CA, its bundle and the callers' certificates.
type Authority struct {
	// Client reads and writes the Secrets and the ConfigMap directly (no cache).
	Client client.Client
	// Self is the manager's own certificate and bundle, which the autoscaler calls
	// agents with; Authority fills it. Set it before Start to share it (nil: a Source
	// of its own).
	Self *pki.Source
	// ManagerName names the manager's identity (macfleet://manager/<name>).
	ManagerName string
	// GatewayName names the gateway's identity; empty issues no gateway Secret.
	GatewayName string
	// MetricsName names the identity of the scraper of the agents' /metrics
	// (macfleet://metrics/<name>, Secret macfleet-metrics-tls); empty issues none.
	MetricsName string
	// GatewayServingSecret, when set, is a kubernetes.io/tls Secret of macfleet-system
	// that the authority keeps with a serving certificate for GatewayServingHosts
	// (pki.IssueServing), which the gateway's own HTTPS listener presents where no
	// other issuer serves the cluster; its clients trust the bundle (ca.crt).
	GatewayServingSecret string
	GatewayServingHosts  []string
	// CALifetime, LeafLifetime and Propagation: see pki; zero means their defaults.
	CALifetime, LeafLifetime, Propagation time.Duration
	Clock                                 clock.Clock
	Log                                   logr.Logger

	mu       sync.RWMutex
	rotation pki.Rotation
	loaded   chan struct{}
	once     sync.Once
}

func (a *Authority) defaults() {
	a.once.Do(func() {
		a.loaded = make(chan struct{})
		if a.Clock == nil {
			a.Clock = clock.RealClock{}
		}
		if a.CALifetime <= 0 {
			a.CALifetime = pki.DefaultCALifetime
		}
		if a.LeafLifetime <= 0 {
			a.LeafLifetime = pki.DefaultLeafLifetime
		}
		if a.Propagation <= 0 {
			a.Propagation = pki.DefaultPropagation
		}
		if a.Self == nil {
			a.Self = &pki.Source{}
		}
		if a.ManagerName == "" {
			a.ManagerName = "macfleet-manager"
		}
	})
}

// NeedLeaderElection: one manager replica keeps the CA.
func (a *Authority) NeedLeaderElection() bool { return true }

// Start keeps the CA until ctx ends: every check (Sync) at the next moment a rotation
// step or a renewal is due, and at least every DefaultResync; a failed check is
// retried within seconds.
func (a *Authority) Start(ctx context.Context) error {
	a.defaults()
	for {
		next, err := a.Sync(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			a.Log.Error(err, "Keeping the fleet CA")
			next = 5 * time.Second
		}
		t := a.Clock.NewTimer(min(next, DefaultResync))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// Loaded is closed once the CA is known (Sign and Issue work).
func (a *Authority) Loaded() <-chan struct{} {
	a.defaults()
	return a.loaded
}

// Sync brings the CA Secret, the bundle ConfigMap, the callers' Secrets (the
// gateway's, the metrics scraper's) and the manager's own certificate up to date, and says how long until the next is due.
func (a *Authority) Sync(ctx context.Context) (time.Duration, error) {
	a.defaults()
	r, err := a.syncCA(ctx)
	if err != nil {
		return 0, err
	}
	a.mu.Lock()
	first := a.rotation.Current == nil
	a.rotation = r
	a.mu.Unlock()
	if first {
		close(a.loaded)
	}
	bundle := pki.EncodeCerts(r.Bundle()...)
	if err := ensureBundle(ctx, a.Client, mfv1.SystemNamespace, bundle); err != nil {
		return 0, err
	}
	now := a.Clock.Now()
	due := pki.NextCheck(r, a.Propagation)
	if err := a.Self.SetBundle(bundle); err != nil {
		return 0, err
	}
	if c := a.Self.Certificate(); c == nil || !now.Before(pki.RenewAt(c.Leaf)) || !signedBy(c.Leaf, r.Current.Cert) {
		certPEM, keyPEM, err := a.issueNew(pki.Manager(a.ManagerName))
		if err == nil {
			err = a.Self.SetCertificate(certPEM, keyPEM)
		}
		if err != nil {
			return 0, fmt.Errorf("issuing the manager's certificate: %w", err)
		}
	}
	due = earliest(due, pki.RenewAt(a.Self.Certificate().Leaf))
	renew, err := a.ensureCallerSecrets(ctx, bundle)
	if err != nil {
		return 0, err
	}
	due = earliest(due, renew)
	return max(due.Sub(now), time.Second), nil
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

func signedBy(leaf, ca *x509.Certificate) bool { return leaf.CheckSignatureFrom(ca) == nil }

// syncCA reads the CA Secret, plays every rotation step due and writes it back if a
// step changed it.
func (a *Authority) syncCA(ctx context.Context) (pki.Rotation, error) {
	key := types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: mfv1.CASecret}
	sec := &corev1.Secret{}
	exists := true
	if err := a.Client.Get(ctx, key, sec); apierrors.IsNotFound(err) {
		exists = false
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Labels: map[string]string{"app.kubernetes.io/part-of": "macfleet"}}, Type: corev1.SecretTypeOpaque}
	} else if err != nil {
		return pki.Rotation{}, fmt.Errorf("reading the CA Secret %s: %w", key, err)
	}
	r, err := decodeRotation(sec.Data)
	if err != nil {
		// A damaged CA is not replaced silently: every agent's certificate hangs on it.
		return pki.Rotation{}, fmt.Errorf("the CA Secret %s: %w; delete it to make a new CA (every agent then renews its certificate)", key, err)
	}
	changed := false
	for range 4 {
		step := pki.Plan(r, a.Clock.Now(), a.Propagation)
		if step == pki.StepNone {
			break
		}
		if r, err = pki.Apply(r, step, a.Clock.Now(), a.CALifetime); err != nil {
			return pki.Rotation{}, err
		}
		a.Log.Info("Rotating the fleet CA", "step", step)
		changed = true
	}
	if !changed {
		return r, nil
	}
	if sec.Data, err = encodeRotation(r); err != nil {
		return pki.Rotation{}, err
	}
	if exists {
		err = a.Client.Update(ctx, sec)
	} else {
		err = a.Client.Create(ctx, sec)
	}
	if err != nil {
		return pki.Rotation{}, fmt.Errorf("writing the CA Secret %s: %w", key, err)
	}
	return r, nil
}

func decodeRotation(d map[string][]byte) (pki.Rotation, error) {
	var r pki.Rotation
	var err error
	if len(d[keyCACert]) > 0 {
		if r.Current, err = pki.ParseCA(d[keyCACert], d[keyCAKey]); err != nil {
			return r, fmt.Errorf("%s: %w", keyCACert, err)
		}
	}
	if len(d[keyNextCert]) > 0 {
		if r.Next, err = pki.ParseCA(d[keyNextCert], d[keyNextKey]); err != nil {
			return r, fmt.Errorf("%s: %w", keyNextCert, err)
		}
	}
	if len(d[keyPrevCert]) > 0 {
		certs, err := pki.ParseCerts(d[keyPrevCert])
		if err != nil {
			return r, fmt.Errorf("%s: %w", keyPrevCert, err)
		}
		r.Previous = certs[0]
	}
	if r.Current == nil && (r.Next != nil || r.Previous != nil) {
		return r, errors.New("it has no current CA")
	}
	return r, nil
}

func encodeRotation(r pki.Rotation) (map[string][]byte, error) {
	d := map[string][]byte{}
	for _, e := range []struct {
		ca        *pki.CA
		cert, key string
	}{{r.Current, keyCACert, keyCAKey}, {r.Next, keyNextCert, keyNextKey}} {
		if e.ca == nil {
			continue
		}
		k, err := pki.EncodeKey(e.ca.Key)
		if err != nil {
			return nil, err
		}
		d[e.cert], d[e.key] = pki.EncodeCerts(e.ca.Cert), k
	}
	if r.Previous != nil {
		d[keyPrevCert] = pki.EncodeCerts(r.Previous)
	}
	return d, nil
}

// ensureBundle writes the bundle ConfigMap of namespace when it differs.
func ensureBundle(ctx context.Context, c client.Client, namespace string, bundle []byte) error {
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: namespace, Name: mfv1.CABundleConfigMap}
	err := c.Get(ctx, key, cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Labels: map[string]string{"app.kubernetes.io/part-of": "macfleet"}},
			Data: map[string]string{mfv1.CABundleKey: string(bundle)}}
		err = c.Create(ctx, cm)
	case err == nil && cm.Data[mfv1.CABundleKey] != string(bundle):
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[mfv1.CABundleKey] = string(bundle)
		err = c.Update(ctx, cm)
	}
	if err != nil {
		return fmt.Errorf("publishing the CA bundle in ConfigMap %s: %w", key, err)
	}
	return nil
}

// issueNew makes a key and a certificate for id from the signing CA.
func (a *Authority) issueNew(id pki.Identity) (certPEM, keyPEM []byte, err error) {
	key, err := pki.NewKey()
	if err != nil {
		return nil, nil, err
	}
	c, err := a.Issue(key.Public(), id)
	if err != nil {
		return nil, nil, err
	}
	kp, err := pki.EncodeKey(key)
	return pki.EncodeCerts(c), kp, err
}

// IssuePEM is a new key and certificate for id, in PEM: a caller's credential that
// an operator (or a test) hands out; the manager's own, the gateway's and the
// metrics scraper's are issued by Sync.
func (a *Authority) IssuePEM(id pki.Identity) (certPEM, keyPEM []byte, err error) {
	return a.issueNew(id)
}

// Bundle is the CA certificates verifiers trust now.
func (a *Authority) Bundle() []*x509.Certificate {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.rotation.Bundle()
}

// Issue signs a certificate for id over pub with the signing CA.
func (a *Authority) Issue(pub any, id pki.Identity) (*x509.Certificate, error) {
	a.defaults()
	a.mu.RLock()
	ca := a.rotation.Current
	a.mu.RUnlock()
	if ca == nil {
		return nil, errors.New("the fleet CA is not loaded yet")
	}
	return ca.Issue(pub, id, a.Clock.Now(), a.LeafLifetime)
}

// Package certs gets and renews the node agent's certificate without any shared
// secret: the agent makes a key that never leaves the Mac, asks for a certificate
// naming its node (macfleet://node/<name>) with a CertificateSigningRequest of the
// signer macfleet.dev/node, authenticated by its node credential, and installs what
// the manager signs (controllers/certsigner). It renews at two thirds of the
// certificate's lifetime, each time with a new key that the old one vouches for (a
// keypin rotation proof: the signer certifies only the key pinned to the Mac or one
// it vouches for), keeps its key on disk so that a restarted agent can still vouch,
// and keeps the fleet CA bundle (ConfigMap
// macfleet-system/macfleet-ca), against which it checks its callers.
package certs

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/pki/keypin"
)

// Defaults of Options.
const (
	DefaultBundlePoll = time.Minute
	// DefaultWait bounds how long one request waits for its certificate before the
	// agent asks again.
	DefaultWait = 2 * time.Minute
)

// Options configure a Keeper.
type Options struct {
	// Clientset reaches the API server with the node's credential.
	Clientset kubernetes.Interface
	NodeName  string
	// KeyFile is where the agent keeps its key (mode 0600, a new one at each
	// renewal): the signer certifies only the key pinned to the Mac, or a new one
	// that key vouches for (package keypin), so an agent that restarts without it
	// gets no certificate until the Mac is re-enrolled. Empty keeps the key in
	// memory only.
	KeyFile string
	// Source receives the certificate and the bundle.
	Source *pki.Source
	// Lifetime asked for (the signer caps it); zero means pki.DefaultLeafLifetime.
	Lifetime   time.Duration
	BundlePoll time.Duration
	Wait       time.Duration
	Clock      clock.WithTicker
	Log        logr.Logger
}

// Keeper keeps the agent's certificate and bundle current.
type Keeper struct {
	o     Options
	ready chan struct{}
	// key is the key of the installed certificate (Run's goroutine only).
	key *ecdsa.PrivateKey
}

// New makes a Keeper.
func New(o Options) *Keeper {
	if o.Lifetime <= 0 {
		o.Lifetime = pki.DefaultLeafLifetime
	}
	if o.BundlePoll <= 0 {
		o.BundlePoll = DefaultBundlePoll
	}
	if o.Wait <= 0 {
		o.Wait = DefaultWait
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Keeper{o: o, ready: make(chan struct{})}
}

// Ready is closed once the agent holds a certificate and a bundle.
func (k *Keeper) Ready() <-chan struct{} { return k.ready }

// Run keeps the certificate and the bundle until ctx ends; failures are logged and
// retried (an agent without a current certificate serves nobody until it has one).
func (k *Keeper) Run(ctx context.Context) error {
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: 1 << 30}
	renewAt, bundleAt := time.Time{}, time.Time{}
	signaled := false
	for ctx.Err() == nil {
		now := k.o.Clock.Now()
		var err error
		if !now.Before(bundleAt) {
			if err = k.refreshBundle(ctx); err == nil {
				bundleAt = now.Add(k.o.BundlePoll)
			}
		}
		if err == nil && !now.Before(renewAt) {
			renewAt, err = k.renew(ctx)
		}
		delay := min(renewAt.Sub(now), bundleAt.Sub(now))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			k.o.Log.Error(err, "Getting the agent's certificate or the fleet CA bundle")
			delay = backoff.Step()
		} else {
			backoff.Duration = time.Second
			if !signaled {
				close(k.ready)
				signaled = true
			}
		}
		t := k.o.Clock.NewTimer(max(delay, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
	return nil
}

func (k *Keeper) refreshBundle(ctx context.Context) error {
	cm, err := k.o.Clientset.CoreV1().ConfigMaps(mfv1.SystemNamespace).Get(ctx, mfv1.CABundleConfigMap, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the fleet CA bundle (ConfigMap %s/%s; the manager publishes it): %w", mfv1.SystemNamespace, mfv1.CABundleConfigMap, err)
	}
	return k.o.Source.SetBundle([]byte(cm.Data[mfv1.CABundleKey]))
}

// renew makes a new key, asks for a certificate for it (with a proof by the key it
// replaces), installs it and returns when to renew it. The new key is written to
// disk before it is asked for, and replaces the old one there once it is certified:
// an agent that stops at any point holds a key the signer accepts when it restarts.
func (k *Keeper) renew(ctx context.Context) (time.Time, error) {
	id := pki.Node(k.o.NodeName)
	if k.key == nil && k.o.KeyFile != "" {
		key, err := readKey(k.o.KeyFile)
		if err != nil {
			return time.Time{}, err
		}
		k.key = key
	}
	next, err := k.nextKey()
	if err != nil {
		return time.Time{}, err
	}
	proof := ""
	if k.key != nil && !k.key.Equal(next) {
		if proof, err = keypin.Prove(k.key, k.o.NodeName, next.Public()); err != nil {
			return time.Time{}, err
		}
	}
	certPEM, name, err := Ask(ctx, k.o.Clientset, k.o.NodeName, next, proof, k.o.Lifetime, k.o.Wait)
	if err != nil {
		return time.Time{}, err
	}
	keyPEM, err := pki.EncodeKey(next)
	if err != nil {
		return time.Time{}, err
	}
	certs, err := pki.ParseCerts(certPEM)
	if err != nil {
		return time.Time{}, fmt.Errorf("the certificate of %s: %w", name, err)
	}
	if got, err := pki.IdentityOf(certs[0]); err != nil || got != id {
		return time.Time{}, fmt.Errorf("the certificate of %s names %v (%v), not %s", name, got, err, id)
	}
	if err := k.o.Source.SetCertificate(certPEM, keyPEM); err != nil {
		return time.Time{}, err
	}
	if k.o.KeyFile != "" {
		if err := os.Rename(k.o.KeyFile+nextSuffix, k.o.KeyFile); err != nil {
			return time.Time{}, fmt.Errorf("keeping the agent's new key: %w", err)
		}
	}
	k.key = next
	at := pki.RenewAt(certs[0])
	k.o.Log.Info("Installed the agent's certificate", "csr", name, "notAfter", certs[0].NotAfter, "renewAt", at, "rotatedKey", proof != "")
	return at, nil
}

// nextSuffix names the file of a key asked for and not yet certified.
const nextSuffix = ".next"

// nextKey is the key to ask a certificate for: the one already on disk waiting for
// its certificate, or a new one (written to disk first).
func (k *Keeper) nextKey() (*ecdsa.PrivateKey, error) {
	if k.o.KeyFile == "" {
		return pki.NewKey()
	}
	path := k.o.KeyFile + nextSuffix
	if key, err := readKey(path); err != nil || key != nil {
		return key, err
	}
	key, err := pki.NewKey()
	if err != nil {
		return nil, err
	}
	b, err := pki.EncodeKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("keeping the agent's key: %w", err)
	}
	return key, credentials.WriteFile(path, b)
}

// readKey reads a PEM key file; a missing file is no key.
func readKey(path string) (*ecdsa.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the agent's key: %w", err)
	}
	key, err := pki.ParseKey(b)
	if err != nil {
		return nil, fmt.Errorf("the agent's key %s: %w; remove it and re-enrol the Mac (macfleet nodes credentials)", path, err)
	}
	return key, nil
}

// Ask asks the signer for node's certificate over key with a CertificateSigningRequest
// (carrying proof, a keypin rotation proof, when not empty), waits at most wait for
// it and returns it (PEM) and the request's name. A denied or failed request is an
// error with the signer's reason.
func Ask(ctx context.Context, cs kubernetes.Interface, node string, key *ecdsa.PrivateKey, proof string,
	lifetime, patience time.Duration) ([]byte, string, error) {
	id := pki.Node(node)
	req, err := pki.NewCSR(key, id)
	if err != nil {
		return nil, "", err
	}
	secs := int32(lifetime / time.Second)
	meta := metav1.ObjectMeta{GenerateName: "macfleet-node-" + node + "-", Labels: map[string]string{"app.kubernetes.io/part-of": "macfleet"}}
	if proof != "" {
		meta.Annotations = map[string]string{keypin.ProofAnnotation: proof}
	}
	csrs := cs.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Create(ctx, &certv1.CertificateSigningRequest{ObjectMeta: meta,
		Spec: certv1.CertificateSigningRequestSpec{Request: req, SignerName: pki.NodeSignerName, ExpirationSeconds: &secs,
			Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth, certv1.UsageClientAuth}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("asking for the certificate of %s: %w", id, err)
	}
	var certPEM []byte
	wctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	err = wait.PollUntilContextCancel(wctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		got, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil // retried until the wait ends
		}
		for _, c := range got.Status.Conditions {
			if (c.Type == certv1.CertificateDenied || c.Type == certv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
				return false, fmt.Errorf("the certificate request %s was %s: %s", csr.Name, c.Type, c.Message)
			}
		}
		certPEM = got.Status.Certificate
		return len(certPEM) > 0, nil
	})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			err = fmt.Errorf("the certificate request %s was not signed within %s: is the manager running?", csr.Name, patience)
		}
		return nil, csr.Name, err
	}
	return certPEM, csr.Name, nil
}

// Package callercert keeps a caller of the node agents (a gateway) on the client
// certificate the manager issues it: the Secret macfleet-system/macfleet-gateway-tls
// (tls.crt, tls.key, ca.crt), renewed by the manager at two thirds of its lifetime
// and re-read here, so that the caller always presents a current certificate and
// trusts the current CA bundle. The gateway's Secret also holds the key every gateway
// replica shares for prefix digests (DigestKeyData, see DigestKey).
package callercert

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
)

// DefaultPoll is how often the Secret is re-read.
const DefaultPoll = 30 * time.Second

// DigestKeyData is the data key, in the gateway's Secret, of the secret every gateway
// replica keys its prefix digests with (prefixdigest.Conversation.KeyedDigests):
// DigestKeySize random bytes the manager writes once and keeps through renewals.
const DigestKeyData = "prefix-digest.key"

// DigestKeySize is the length of the key under DigestKeyData.
const DigestKeySize = 32

// DigestKey holds the prefix-digest key read from the gateway's Secret; the zero value
// holds none until Keep loads it.
type DigestKey struct{ p atomic.Pointer[[]byte] }

// Get returns the key, ok false until one has loaded.
func (k *DigestKey) Get() (key []byte, ok bool) {
	if p := k.p.Load(); p != nil {
		return *p, true
	}
	return nil, false
}

// set keeps b when it is a key of DigestKeySize bytes; else it reports what is wrong.
func (k *DigestKey) set(namespace, name string, b []byte) error {
	if len(b) != DigestKeySize {
		return fmt.Errorf("Secret %s/%s has no prefix-digest key (%s of %d bytes, found %d): the manager adds it; "+
			"requests are not routed by prefix until it does", namespace, name, DigestKeyData, DigestKeySize, len(b))
	}
	if cur, ok := k.Get(); !ok || string(cur) != string(b) {
		b = append([]byte(nil), b...)
		k.p.Store(&b)
	}
	return nil
}

// Load reads the Secret namespace/name into src.
func Load(ctx context.Context, cs kubernetes.Interface, namespace, name string, src *pki.Source) error {
	err, _ := load(ctx, cs, namespace, name, src, nil)
	return err
}

// load reads the Secret namespace/name into src and, when key is set, its
// prefix-digest key into key; keyErr says why the key did not load.
func load(ctx context.Context, cs kubernetes.Interface, namespace, name string, src *pki.Source, key *DigestKey) (err, keyErr error) {
	sec, err := cs.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the agent client certificate from Secret %s/%s (the manager issues it): %w", namespace, name, err), nil
	}
	if err := src.SetCertificate(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return fmt.Errorf("Secret %s/%s: %w", namespace, name, err), nil
	}
	if err := src.SetBundle(sec.Data[mfv1.CABundleKey]); err != nil {
		return fmt.Errorf("Secret %s/%s: %w", namespace, name, err), nil
	}
	if key != nil {
		return nil, key.set(namespace, name, sec.Data[DigestKeyData])
	}
	return nil, nil
}

// Keep loads the Secret until ctx ends (its prefix-digest key into key, when set):
// every second until the first load succeeds, then every poll. ready is closed after
// the first load.
func Keep(ctx context.Context, cs kubernetes.Interface, namespace, name string, src *pki.Source, key *DigestKey,
	poll time.Duration, ready chan<- struct{}, log logr.Logger) {
	if poll <= 0 {
		poll = DefaultPoll
	}
	loaded, lastKeyErr := false, ""
	for {
		err, keyErr := load(ctx, cs, namespace, name, src, key)
		if err != nil && ctx.Err() == nil {
			log.Error(err, "Loading the certificate the gateway presents to agents; requests to agents fail until it loads")
		}
		if msg := fmt.Sprint(keyErr); keyErr != nil && msg != lastKeyErr && ctx.Err() == nil {
			log.Error(keyErr, "Loading the prefix-digest key the gateways share")
			lastKeyErr = msg
		} else if keyErr == nil && err == nil {
			lastKeyErr = ""
		}
		if err == nil && !loaded {
			loaded = true
			log.Info("Loaded the certificate the gateway presents to agents", "secret", namespace+"/"+name,
				"notAfter", src.Certificate().Leaf.NotAfter)
			if ready != nil {
				close(ready)
			}
		}
		wait := poll
		if !loaded {
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Package callercert keeps a caller of the node agents (a gateway) on the client
// certificate the manager issues it: the Secret macfleet-system/macfleet-gateway-tls
// (tls.crt, tls.key, ca.crt), renewed by the manager at two thirds of its lifetime
// and re-read here, so that the caller always presents a current certificate and
// trusts the current CA bundle.
package callercert

import (
	"context"
	"fmt"
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

// Load reads the Secret namespace/name into src.
func Load(ctx context.Context, cs kubernetes.Interface, namespace, name string, src *pki.Source) error {
	sec, err := cs.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the agent client certificate from Secret %s/%s (the manager issues it): %w", namespace, name, err)
	}
	if err := src.SetCertificate(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return fmt.Errorf("Secret %s/%s: %w", namespace, name, err)
	}
	if err := src.SetBundle(sec.Data[mfv1.CABundleKey]); err != nil {
		return fmt.Errorf("Secret %s/%s: %w", namespace, name, err)
	}
	return nil
}

// Keep loads the Secret until ctx ends: every second until the first load succeeds,
// then every poll. ready is closed after the first load.
func Keep(ctx context.Context, cs kubernetes.Interface, namespace, name string, src *pki.Source, poll time.Duration, ready chan<- struct{}, log logr.Logger) {
	if poll <= 0 {
		poll = DefaultPoll
	}
	loaded := false
	for {
		err := Load(ctx, cs, namespace, name, src)
		if err != nil && ctx.Err() == nil {
			log.Error(err, "Loading the certificate the gateway presents to agents; requests to agents fail until it loads")
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

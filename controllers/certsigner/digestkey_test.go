package certsigner_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/certsigner"
	"github.com/macfleet/macfleet/internal/callercert"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestGatewaySecretKeepsItsDigestKey: the manager makes the prefix-digest key the
// gateways share once, in the gateway's Secret only, and keeps it through the
// certificate's renewal; a malformed key is made again; a gateway reading the Secret
// (callercert.Keep, against the real API server) loads it.
func TestGatewaySecretKeepsItsDigestKey(t *testing.T) {
	ctx := t.Context()
	for _, ns := range []string{mfv1.SystemNamespace, mfv1.NodeIdentityNamespace, mfv1.NodeLeaseNamespace} {
		_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	for _, name := range []string{mfv1.GatewayTLSSecret, mfv1.MetricsTLSSecret} {
		_ = env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.SystemNamespace, Name: name}}) // an earlier test's
	}
	clk := clocktesting.NewFakeClock(time.Now())
	a := &certsigner.Authority{Client: env.Client, GatewayName: "gw", MetricsName: "scraper", Clock: clk, Log: logr.Discard()}
	secret := func(name string) *corev1.Secret {
		t.Helper()
		if _, err := a.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		s := &corev1.Secret{}
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: name}, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := secret(mfv1.GatewayTLSSecret)
	key := first.Data[callercert.DigestKeyData]
	if len(key) != callercert.DigestKeySize || bytes.Equal(key, make([]byte, len(key))) {
		t.Fatalf("the gateway's Secret has prefix-digest key %x, want %d random bytes", key, callercert.DigestKeySize)
	}
	if k, ok := secret(mfv1.MetricsTLSSecret).Data[callercert.DigestKeyData]; ok {
		t.Errorf("the scraper's Secret holds a prefix-digest key (%d bytes)", len(k))
	}

	// The certificate's renewal keeps the key.
	certs, _ := pki.ParseCerts(first.Data[corev1.TLSCertKey])
	clk.Step(pki.RenewAt(certs[0]).Sub(clk.Now()) + time.Second)
	renewed := secret(mfv1.GatewayTLSSecret)
	if bytes.Equal(renewed.Data[corev1.TLSCertKey], first.Data[corev1.TLSCertKey]) {
		t.Fatal("the gateway's certificate was not renewed")
	}
	if got := renewed.Data[callercert.DigestKeyData]; !bytes.Equal(got, key) {
		t.Errorf("the renewal changed the prefix-digest key: %x, was %x", got, key)
	}

	// A gateway loads it.
	loaded := &callercert.DigestKey{}
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go callercert.Keep(kctx, admin(), mfv1.SystemNamespace, mfv1.GatewayTLSSecret, &pki.Source{}, loaded, 10*time.Millisecond, nil, logr.Discard())
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		got, ok := loaded.Get()
		return ok && bytes.Equal(got, key), "the gateway loads the prefix-digest key"
	})

	// A malformed key is made again (and the gateway loads the new one).
	renewed.Data[callercert.DigestKeyData] = []byte("short")
	if err := env.Client.Update(ctx, renewed); err != nil {
		t.Fatal(err)
	}
	again := secret(mfv1.GatewayTLSSecret).Data[callercert.DigestKeyData]
	if len(again) != callercert.DigestKeySize || bytes.Equal(again, key) {
		t.Errorf("after a malformed key the Secret holds %x, want a new key of %d bytes", again, callercert.DigestKeySize)
	}
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		got, _ := loaded.Get()
		return bytes.Equal(got, again), "the gateway loads the new prefix-digest key"
	})
}

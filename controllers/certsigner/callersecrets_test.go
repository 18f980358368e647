package certsigner_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"strings"
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

// TestAuthorityKeepsTheMetricsSecret: the manager issues the metrics scraper's
// certificate (macfleet://metrics/<name>) into its own Secret next to the gateway's,
// renews it at two thirds of its life, issues it again when the Secret names another
// identity (a gateway's certificate copied over it), and a Mac may not read it.
func TestAuthorityKeepsTheMetricsSecret(t *testing.T) {
	ctx := t.Context()
	freshCallerSecrets(t)
	if err := env.Apply(ctx, "config/agent", "config/admission"); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	a := &certsigner.Authority{Client: env.Client, GatewayName: "gw", MetricsName: "scraper", Clock: clk, Log: logr.Discard()}
	sync := func() time.Duration {
		t.Helper()
		next, err := a.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return next
	}
	secret := func(name string) *corev1.Secret {
		t.Helper()
		s := &corev1.Secret{}
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: name}, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// leaf checks the Secret's certificate as an agent does and returns it.
	leaf := func(name string, want pki.Identity) *x509.Certificate {
		t.Helper()
		s := secret(name)
		src := &pki.Source{}
		if err := src.SetCertificate(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
			t.Fatalf("Secret %s: %v", name, err)
		}
		if err := src.SetBundle(s.Data[mfv1.CABundleKey]); err != nil {
			t.Fatalf("Secret %s: %v", name, err)
		}
		c := src.Certificate().Leaf
		if id, err := pki.Verify([]*x509.Certificate{c}, src.Roots(), clk.Now(), x509.ExtKeyUsageClientAuth); err != nil || id != want {
			t.Fatalf("Secret %s's certificate as an agent checks it: %v, %v; want %s", name, id, err, want)
		}
		return c
	}

	next := sync()
	first := leaf(mfv1.MetricsTLSSecret, pki.Metrics("scraper"))
	leaf(mfv1.GatewayTLSSecret, pki.Gateway("gw"))
	if due := pki.RenewAt(first).Sub(clk.Now()); next > due+time.Second {
		t.Errorf("the next check is in %v, after the scraper's renewal (in %v)", next, due)
	}
	// Before its renewal it stays as it is.
	sync()
	if c := leaf(mfv1.MetricsTLSSecret, pki.Metrics("scraper")); !c.Equal(first) {
		t.Error("the scraper's certificate was issued again before its renewal was due")
	}
	// At two thirds of its life it is issued again.
	clk.Step(pki.RenewAt(first).Sub(clk.Now()) + time.Second)
	sync()
	renewed := leaf(mfv1.MetricsTLSSecret, pki.Metrics("scraper"))
	if renewed.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Error("the scraper's certificate was not renewed at two thirds of its life")
	}
	// A gateway's certificate put in the scraper's Secret is replaced by the scraper's.
	s, gw := secret(mfv1.MetricsTLSSecret), secret(mfv1.GatewayTLSSecret)
	s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey] = gw.Data[corev1.TLSCertKey], gw.Data[corev1.TLSPrivateKeyKey]
	if err := env.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	sync()
	leaf(mfv1.MetricsTLSSecret, pki.Metrics("scraper"))

	// A Mac reads neither Secret.
	cs := nodeClientset(t, "mac-scrape")
	for _, name := range []string{mfv1.MetricsTLSSecret, mfv1.GatewayTLSSecret} {
		if _, err := cs.CoreV1().Secrets(mfv1.SystemNamespace).Get(ctx, name, metav1.GetOptions{}); err == nil || !strings.Contains(err.Error(), "forbidden") {
			t.Errorf("a node reading Secret %s: %v; want forbidden", name, err)
		}
	}
}

// TestAuthorityKeepsTheServingSecret: with a serving Secret named, the manager keeps
// in it a certificate from the fleet CA for the gateway's hosts, which HTTPS clients
// trusting its ca.crt accept for those names only; a changed list of hosts, or an
// identity's certificate copied over it, is issued again; a Mac may not read it.
func TestAuthorityKeepsTheServingSecret(t *testing.T) {
	ctx := t.Context()
	for _, ns := range []string{mfv1.SystemNamespace, mfv1.NodeIdentityNamespace, mfv1.NodeLeaseNamespace} {
		_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	if err := env.Apply(ctx, "config/agent", "config/admission"); err != nil {
		t.Fatal(err)
	}
	const name = "macfleet-gateway-https"
	clk := clocktesting.NewFakeClock(time.Now())
	a := &certsigner.Authority{Client: env.Client, GatewayName: "gw", GatewayServingSecret: name,
		GatewayServingHosts: []string{"llm.example.com", "macfleet-gateway.macfleet-system.svc"}, Clock: clk, Log: logr.Discard()}
	served := func(host string) (*x509.Certificate, error) {
		t.Helper()
		s := syncedSecret(t, a, name)
		certs, err := pki.ParseCerts(s.Data[corev1.TLSCertKey])
		if err != nil || s.Type != corev1.SecretTypeTLS {
			t.Fatalf("Secret %s of type %s: %v", name, s.Type, err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(s.Data[mfv1.CABundleKey]) {
			t.Fatalf("Secret %s has no CA bundle", name)
		}
		_, err = certs[0].Verify(x509.VerifyOptions{DNSName: host, Roots: roots, CurrentTime: clk.Now()})
		return certs[0], err
	}
	first, err := served("llm.example.com")
	if err != nil {
		t.Fatalf("HTTPS to llm.example.com: %v", err)
	}
	if _, err := served("other.example.com"); err == nil {
		t.Error("the serving certificate verifies for a host it was not issued for")
	}
	if _, err := pki.IdentityOf(first); err == nil {
		t.Error("the serving certificate names one of the fleet's identities")
	}
	if again, _ := served("llm.example.com"); !again.Equal(first) {
		t.Error("the serving certificate was issued again before its renewal was due")
	}
	// Another host: issued again for the new list.
	a.GatewayServingHosts = []string{"llm.example.com", "llm.example.org"}
	if c, err := served("llm.example.org"); err != nil || c.Equal(first) {
		t.Errorf("after adding llm.example.org: %v (issued again: %v)", err, !c.Equal(first))
	}
	// The gateway's client certificate copied over it is replaced.
	s, gw := &corev1.Secret{}, &corev1.Secret{}
	for n, into := range map[string]*corev1.Secret{name: s, mfv1.GatewayTLSSecret: gw} {
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: n}, into); err != nil {
			t.Fatal(err)
		}
	}
	s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey] = gw.Data[corev1.TLSCertKey], gw.Data[corev1.TLSPrivateKeyKey]
	if err := env.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := served("llm.example.org"); err != nil {
		t.Errorf("after an identity's certificate was copied over it: %v", err)
	}
	cs := nodeClientset(t, "mac-serving")
	if _, err := cs.CoreV1().Secrets(mfv1.SystemNamespace).Get(ctx, name, metav1.GetOptions{}); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("a node reading Secret %s: %v; want forbidden", name, err)
	}
}

// TestGatewaySecretKeepsItsDigestKey: the manager makes the prefix-digest key the
// gateways share once, in the gateway's Secret only, and keeps it through the
// certificate's renewal; a malformed key is made again; a gateway reading the Secret
// (callercert.Keep, against the real API server) loads it.
func TestGatewaySecretKeepsItsDigestKey(t *testing.T) {
	ctx := t.Context()
	freshCallerSecrets(t)
	clk := clocktesting.NewFakeClock(time.Now())
	a := &certsigner.Authority{Client: env.Client, GatewayName: "gw", MetricsName: "scraper", Clock: clk, Log: logr.Discard()}
	secret := func(name string) *corev1.Secret { t.Helper(); return syncedSecret(t, a, name) }
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

// freshCallerSecrets makes the fleet's namespaces and deletes the gateway's and the
// scraper's Secrets an earlier test left.
func freshCallerSecrets(t *testing.T) {
	ctx := t.Context()
	for _, ns := range []string{mfv1.SystemNamespace, mfv1.NodeIdentityNamespace, mfv1.NodeLeaseNamespace} {
		_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	for _, name := range []string{mfv1.GatewayTLSSecret, mfv1.MetricsTLSSecret} {
		_ = env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.SystemNamespace, Name: name}})
	}
}

// syncedSecret is the system namespace's Secret name after one Sync of a.
func syncedSecret(t *testing.T, a *certsigner.Authority, name string) *corev1.Secret {
	t.Helper()
	if _, err := a.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{}
	if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: name}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

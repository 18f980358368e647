package certsigner_test

import (
	"context"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/macfleet/macfleet/agent/certs"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/certsigner"
	"github.com/macfleet/macfleet/controllers/certsigner/certsignertest"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.ConsoleEncoder()))
	testenv.Main(m, &env, testenv.WithScheme(mfv1.AddToScheme))
}

// startSigner installs the node RBAC and admission policy and runs the authority and
// the signer in a manager until the test ends.
func startSigner(t *testing.T, tune ...func(*certsigner.Signer)) *certsigner.Authority {
	t.Helper()
	ctx := t.Context()
	for _, ns := range []string{mfv1.SystemNamespace, mfv1.NodeIdentityNamespace, mfv1.NodeLeaseNamespace} {
		_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	if err := env.Apply(ctx, "config/agent", "config/admission"); err != nil {
		t.Fatal(err)
	}
	return certsignertest.Start(t, env, tune...)
}

// nodeClientset is a clientset with node's own credential, as its agent holds.
func nodeClientset(t *testing.T, node string) kubernetes.Interface {
	t.Helper()
	cs, _ := enrol(t, node)
	return cs
}

// runKeeper runs an agent's certificate keeper with node's own credential (on clk,
// when set) until the test ends, and returns its Source once it holds a certificate.
func runKeeper(t *testing.T, node string, clk *clocktesting.FakeClock) *pki.Source {
	t.Helper()
	src := &pki.Source{}
	o := certs.Options{Clientset: nodeClientset(t, node), NodeName: node, Source: src, Log: logr.Discard()}
	if clk != nil {
		o.Clock = clk
	}
	k := certs.New(o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-k.Ready():
	case <-time.After(60 * time.Second):
		t.Fatalf("the agent of %s got no certificate within 60s", node)
	}
	return src
}

// TestAgentGetsItsOwnCertificate: an agent with only its node credential gets a
// certificate naming its node through the CSR API, and the bundle that verifies it;
// the gateway's Secret holds a gateway certificate of the same CA.
func TestAgentGetsItsOwnCertificate(t *testing.T) {
	startSigner(t)
	src := runKeeper(t, "mac-own", nil)
	leaf := src.Certificate().Leaf
	if err := pki.VerifyServer([]*x509.Certificate{leaf}, src.Roots(), time.Now(), pki.Node("mac-own")); err != nil {
		t.Fatalf("the agent's certificate: %v", err)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life > pki.DefaultLeafLifetime+10*time.Minute {
		t.Errorf("the agent's certificate lasts %v, want at most %v", life, pki.DefaultLeafLifetime)
	}

	gw := &corev1.Secret{}
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: mfv1.GatewayTLSSecret}, gw)
		return err == nil, "the gateway's Secret: " + errString(err)
	})
	gsrc := &pki.Source{}
	if err := gsrc.SetCertificate(gw.Data[corev1.TLSCertKey], gw.Data[corev1.TLSPrivateKeyKey]); err != nil {
		t.Fatal(err)
	}
	if id, err := pki.Verify([]*x509.Certificate{gsrc.Certificate().Leaf}, src.Roots(), time.Now(), x509.ExtKeyUsageClientAuth); err != nil || id != pki.Gateway("macfleet-gateway") {
		t.Fatalf("the gateway's certificate as the agent checks it: %v, %v", id, err)
	}
}

// TestNodeMayAskOnlyForItsOwnCertificate: a compromised Mac asks the signer for
// a certificate naming another Mac (or a gateway, to reach every agent's admin API);
// it must get a Denied request and no certificate, and no other signer at all.
func TestNodeMayAskOnlyForItsOwnCertificate(t *testing.T) {
	startSigner(t)
	cs := nodeClientset(t, "mac-evil")
	key, _ := pki.NewKey()
	for _, id := range []pki.Identity{pki.Node("mac-victim"), pki.Gateway("macfleet-gateway"), pki.Manager("macfleet-manager")} {
		req, err := pki.NewCSR(key, id)
		if err != nil {
			t.Fatal(err)
		}
		csr, err := cs.CertificatesV1().CertificateSigningRequests().Create(t.Context(), &certv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "evil-"},
			Spec: certv1.CertificateSigningRequestSpec{Request: req, SignerName: pki.NodeSignerName,
				Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var got *certv1.CertificateSigningRequest
		testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
			got, err = cs.CertificatesV1().CertificateSigningRequests().Get(t.Context(), csr.Name, metav1.GetOptions{})
			return err == nil && len(got.Status.Conditions) > 0, "no decision on " + csr.Name
		})
		c := got.Status.Conditions[0]
		if c.Type != certv1.CertificateDenied || !strings.Contains(c.Message, "must name exactly "+pki.Node("mac-evil").String()) || len(got.Status.Certificate) > 0 {
			t.Fatalf("mac-evil asking for %s: condition %s %q, %d certificate bytes; want Denied naming its own identity", id, c.Type, c.Message, len(got.Status.Certificate))
		}
	}
	// Other signers are refused at admission: a node cannot ask the cluster's own CA
	// for an API server client certificate.
	req, _ := pki.NewCSR(key, pki.Node("mac-evil"))
	_, err := cs.CertificatesV1().CertificateSigningRequests().Create(t.Context(), &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "evil-"},
		Spec: certv1.CertificateSigningRequestSpec{Request: req, SignerName: certv1.KubeAPIServerClientSignerName,
			Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
	}, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "may only modify") {
		t.Fatalf("a node's request to %s: %v; want refused by the admission policy", certv1.KubeAPIServerClientSignerName, err)
	}
	// Nor read the CA's key or the gateway's credential.
	for _, name := range []string{mfv1.CASecret, mfv1.GatewayTLSSecret, mfv1.FleetTokenSecret} {
		if _, err := cs.CoreV1().Secrets(mfv1.SystemNamespace).Get(t.Context(), name, metav1.GetOptions{}); err == nil || !strings.Contains(err.Error(), "forbidden") {
			t.Errorf("a node reading Secret %s: %v; want forbidden", name, err)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestAuthorityRotatesTheCA walks the CA Secret, the bundle ConfigMap and the
// gateway's Secret through a rotation on a fake clock: the successor is published
// before it signs, then signs (the gateway's certificate is issued again from it)
// while the old CA stays in the bundle.
func TestAuthorityRotatesTheCA(t *testing.T) {
	ctx := t.Context()
	_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mfv1.SystemNamespace}})
	for _, o := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.SystemNamespace, Name: mfv1.CASecret}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.SystemNamespace, Name: mfv1.GatewayTLSSecret}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: mfv1.SystemNamespace, Name: mfv1.CABundleConfigMap}},
	} {
		_ = env.Client.Delete(ctx, o) // an earlier test's
	}
	clk := clocktesting.NewFakeClock(time.Now())
	a := &certsigner.Authority{Client: env.Client, GatewayName: "gw", Clock: clk, Log: logr.Discard()}
	sync := func() {
		t.Helper()
		if _, err := a.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	bundle := func() []*x509.Certificate {
		t.Helper()
		cm := &corev1.ConfigMap{}
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: mfv1.CABundleConfigMap}, cm); err != nil {
			t.Fatal(err)
		}
		certs, err := pki.ParseCerts([]byte(cm.Data[mfv1.CABundleKey]))
		if err != nil {
			t.Fatal(err)
		}
		return certs
	}
	gatewayIssuer := func() string {
		t.Helper()
		s := &corev1.Secret{}
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: mfv1.SystemNamespace, Name: mfv1.GatewayTLSSecret}, s); err != nil {
			t.Fatal(err)
		}
		certs, err := pki.ParseCerts(s.Data[corev1.TLSCertKey])
		if err != nil {
			t.Fatal(err)
		}
		return certs[0].Issuer.CommonName
	}

	sync()
	first := bundle()
	if len(first) != 1 || gatewayIssuer() != first[0].Subject.CommonName {
		t.Fatalf("after the first sync: bundle of %d, gateway issued by %q", len(first), gatewayIssuer())
	}
	// Two thirds of the CA's year: the successor is published, the old CA still signs.
	clk.Step(pki.RenewAt(first[0]).Sub(clk.Now()) + time.Second)
	sync()
	if b := bundle(); len(b) != 2 || gatewayIssuer() != first[0].Subject.CommonName {
		t.Fatalf("after two thirds: bundle of %d (want old and successor), gateway issued by %q (want the old CA)", len(b), gatewayIssuer())
	}
	next := bundle()[1]
	// A propagation later the successor signs; the old CA stays trusted.
	clk.Step(pki.DefaultPropagation)
	sync()
	b := bundle()
	if len(b) != 2 || !b[0].Equal(next) || !b[1].Equal(first[0]) {
		t.Fatalf("after the promotion: bundle %v, want the successor then the old CA", b)
	}
	if got := gatewayIssuer(); got != next.Subject.CommonName {
		t.Errorf("after the promotion the gateway's certificate is issued by %q, want the successor %q", got, next.Subject.CommonName)
	}
	if c := a.Self.Certificate().Leaf; c.CheckSignatureFrom(next) != nil {
		t.Error("after the promotion the manager's own certificate is not from the successor")
	}
}

// TestAgentRenewsItsCertificate: at two thirds of its certificate's life the agent
// asks for a new one and serves with it.
func TestAgentRenewsItsCertificate(t *testing.T) {
	startSigner(t)
	clk := clocktesting.NewFakeClock(time.Now())
	src := runKeeper(t, "mac-renew", clk)
	first := src.Certificate().Leaf
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		return clk.HasWaiters(), "the keeper is not waiting for its next check"
	})
	clk.Step(pki.RenewAt(first).Sub(clk.Now()) + time.Second)
	testenv.Eventually(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		c := src.Certificate().Leaf
		return c.SerialNumber.Cmp(first.SerialNumber) != 0, "still the first certificate"
	})
	if got, err := pki.IdentityOf(src.Certificate().Leaf); err != nil || got != pki.Node("mac-renew") {
		t.Errorf("the renewed certificate names %v (%v)", got, err)
	}
}

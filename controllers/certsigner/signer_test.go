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
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/macfleet/macfleet/agent/certs"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/certsigner"
	"github.com/macfleet/macfleet/controllers/certsigner/certsignertest"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/internal/testenv"
	"github.com/macfleet/macfleet/pki"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.ConsoleEncoder()))
	testenv.Main(m, &env, testenv.WithScheme(mfv1.AddToScheme))
}

// startSigner installs the node RBAC and admission policy and runs the authority and
// the signer in a manager until the test ends.
func startSigner(t *testing.T) *certsigner.Authority {
	t.Helper()
	ctx := t.Context()
	for _, ns := range []string{mfv1.SystemNamespace, mfv1.NodeIdentityNamespace, mfv1.NodeLeaseNamespace} {
		_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	if err := env.Apply(ctx, "config/agent", "config/admission"); err != nil {
		t.Fatal(err)
	}
	return certsignertest.Start(t, env)
}

// nodeClientset is a clientset with node's own credential, as its agent holds.
func nodeClientset(t *testing.T, node string) kubernetes.Interface {
	t.Helper()
	cred, err := credentials.Issue(t.Context(), kubernetes.NewForConfigOrDie(env.Config), env.Config, node, credentials.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(cred.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(rc)
}

// TestAgentGetsItsOwnCertificate: an agent with only its node credential gets a
// certificate naming its node through the CSR API, and the bundle that verifies it;
// the gateway's Secret holds a gateway certificate of the same CA.
func TestAgentGetsItsOwnCertificate(t *testing.T) {
	startSigner(t)
	src := &pki.Source{}
	k := certs.New(certs.Options{Clientset: nodeClientset(t, "mac-own"), NodeName: "mac-own", Source: src, Log: logr.Discard()})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-k.Ready():
	case <-time.After(60 * time.Second):
		t.Fatal("the agent got no certificate within 60s")
	}
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

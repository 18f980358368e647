package certsigner_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/macfleet/macfleet/agent/certs"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/certsigner"
	"github.com/macfleet/macfleet/controllers/certsigner/csrcleanup"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/pki/keypin"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// enrol issues node's credential, as `macfleet nodes credentials` does, and returns
// a clientset holding it and what Issue said.
func enrol(t *testing.T, node string) (kubernetes.Interface, *credentials.Credential) {
	t.Helper()
	cred, err := credentials.Issue(t.Context(), kubernetes.NewForConfigOrDie(env.Config), env.Config, node, credentials.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(cred.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(rc), cred
}

// keep runs a certificate keeper of node with cs and keyFile until it holds a
// certificate, stops it and returns the certificate's key.
func keep(t *testing.T, cs kubernetes.Interface, node, keyFile string) *ecdsa.PublicKey {
	t.Helper()
	src := &pki.Source{}
	k := certs.New(certs.Options{Clientset: cs, NodeName: node, KeyFile: keyFile, Source: src, Log: logr.Discard()})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-k.Ready():
	case <-time.After(60 * time.Second):
		t.Fatalf("the agent of %s got no certificate within 60s", node)
	}
	return src.Certificate().Leaf.PublicKey.(*ecdsa.PublicKey)
}

func pinOf(t *testing.T, node string) string {
	t.Helper()
	s, err := admin().CoreV1().Secrets(mfv1.NodeIdentityNamespace).Get(t.Context(), credentials.BindingSecretName(node), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Annotations[keypin.PinAnnotation]
}

func fingerprint(t *testing.T, pub *ecdsa.PublicKey) string {
	t.Helper()
	fp, err := keypin.Fingerprint(pub)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// TestCertificatesFollowThePinnedKey: the agent's first certificate pins its key; a
// copy of its token asking for another key is denied (with or without a proof of its
// own); the agent, restarted from its key file, rotates to a new key its old one
// vouches for; an agent that lost its key is denied until the Mac is re-enrolled,
// which clears the pin and says so.
func TestCertificatesFollowThePinnedKey(t *testing.T) {
	startSigner(t)
	const node = "mac-pin"
	cs, _ := enrol(t, node)
	keyFile := filepath.Join(t.TempDir(), "identity", "node.key")

	first := keep(t, cs, node, keyFile)
	if got, want := pinOf(t, node), fingerprint(t, first); got != want {
		t.Fatalf("after the first certificate the pin is %q, want the agent's key %q", got, want)
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the agent's key file: %v, %v; want mode 0600", fi, err)
	}

	thief, _ := pki.NewKey()
	forged, _ := keypin.Prove(thief, node, thief.Public())
	for _, proof := range []string{"", forged} {
		certPEM, name, err := certs.Ask(t.Context(), cs, node, thief, proof, time.Hour, 30*time.Second)
		if err == nil || !strings.Contains(err.Error(), "Denied") || len(certPEM) > 0 {
			t.Fatalf("a copy of the token asking for its own key (proof %q): %d certificate bytes, %v; want Denied", proof, len(certPEM), err)
		}
		got, _ := admin().CertificatesV1().CertificateSigningRequests().Get(t.Context(), name, metav1.GetOptions{})
		if c := got.Status.Conditions[0]; c.Reason != certsigner.ReasonNotPinnedKey || !strings.Contains(c.Message, "macfleet nodes credentials "+node) {
			t.Errorf("the thief's request %s: %s %s %q; want %s naming the fix", name, c.Type, c.Reason, c.Message, certsigner.ReasonNotPinnedKey)
		}
	}

	// The pin is out of the node identity's reach.
	patch := []byte(`{"metadata":{"annotations":{"` + keypin.PinAnnotation + `":"` + fingerprint(t, &thief.PublicKey) + `"}}}`)
	if _, err := cs.CoreV1().Secrets(mfv1.NodeIdentityNamespace).Patch(t.Context(), credentials.BindingSecretName(node),
		types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node identity re-pinning its key: %v; want forbidden", err)
	}

	// A restarted agent reads its key, rotates to a new one and moves the pin.
	second := keep(t, cs, node, keyFile)
	if second.Equal(first) {
		t.Error("the restarted agent kept its key; want a new one at each renewal")
	}
	if got, want := pinOf(t, node), fingerprint(t, second); got != want {
		t.Errorf("after the rotation the pin is %q, want the new key %q", got, want)
	}
	if _, err := os.Stat(keyFile + ".next"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the certified key is still waiting in %s.next: %v", keyFile, err)
	}

	// An agent stopped after the pin moved to its new key (node.key.next) and before
	// it installed the certificate restarts with that key, which is now the pin.
	onDisk, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	current, err := pki.ParseKey(onDisk)
	if err != nil {
		t.Fatal(err)
	}
	pending, _ := pki.NewKey()
	pendingPEM, _ := pki.EncodeKey(pending)
	if err := os.WriteFile(keyFile+".next", pendingPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	proof, _ := keypin.Prove(current, node, pending.Public())
	if _, _, err := certs.Ask(t.Context(), cs, node, pending, proof, time.Hour, 30*time.Second); err != nil {
		t.Fatalf("the rotation the agent was stopped in: %v", err)
	}
	if got := keep(t, cs, node, keyFile); !got.Equal(&pending.PublicKey) {
		t.Error("the agent restarted after the pin moved does not serve the pinned key it had waiting")
	}
	if onDisk, _ = os.ReadFile(keyFile); string(onDisk) != string(pendingPEM) {
		t.Error("the pinned key it had waiting did not replace its old key on disk")
	}
	second = &pending.PublicKey

	// The Mac lost its key: denied, until it is re-enrolled.
	lost := filepath.Join(t.TempDir(), "node.key")
	key, _ := pki.NewKey()
	if _, _, err := certs.Ask(t.Context(), cs, node, key, "", time.Hour, 30*time.Second); err == nil || !strings.Contains(err.Error(), "re-enrol") {
		t.Fatalf("an agent without its key: %v; want Denied naming re-enrolment", err)
	}
	cs2, cred := enrol(t, node)
	if cred.PinReset != fingerprint(t, second) {
		t.Errorf("re-enrolling reports the cleared pin %q, want %q", cred.PinReset, fingerprint(t, second))
	}
	third := keep(t, cs2, node, lost)
	if got, want := pinOf(t, node), fingerprint(t, third); got != want {
		t.Errorf("after re-enrolment the pin is %q, want the new agent's key %q", got, want)
	}
}

// TestSignerDeletesFinishedRequests: the signer deletes its issued requests after
// Retention.Issued and refused ones after Retention.Refused (short here), and leaves
// other signers' requests alone.
func TestSignerDeletesFinishedRequests(t *testing.T) {
	startSigner(t, func(s *certsigner.Signer) {
		s.Retention = csrcleanup.Retention{Issued: 2 * time.Second, Refused: 5 * time.Second, Pending: time.Hour}
	})
	cs, _ := enrol(t, "mac-tidy")
	key, _ := pki.NewKey()
	_, issued, err := certs.Ask(t.Context(), cs, "mac-tidy", key, "", time.Hour, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := pki.NewKey()
	_, denied, err := certs.Ask(t.Context(), cs, "mac-tidy", other, "", time.Hour, 30*time.Second)
	if err == nil {
		t.Fatal("a second key without a proof was signed")
	}
	req, _ := pki.NewCSR(key, pki.Node("mac-tidy"))
	foreign, err := admin().CertificatesV1().CertificateSigningRequests().Create(t.Context(), &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "foreign-"},
		Spec: certv1.CertificateSigningRequestSpec{Request: req, SignerName: "example.com/other",
			Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	csrs := admin().CertificatesV1().CertificateSigningRequests()
	gone := func(name string) (bool, string) {
		_, err := csrs.Get(t.Context(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), name + " still exists (" + errString(err) + ")"
	}
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) { return gone(issued) })
	if ok, _ := gone(denied); ok {
		t.Errorf("the denied request %s was deleted with the issued one; want it kept longer", denied)
	}
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) { return gone(denied) })
	if ok, _ := gone(foreign.Name); ok {
		t.Errorf("the request %s of another signer was deleted", foreign.Name)
	}
}

func admin() kubernetes.Interface { return kubernetes.NewForConfigOrDie(env.Config) }

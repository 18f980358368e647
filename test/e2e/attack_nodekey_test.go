package e2e

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/certs"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/certsigner"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/pki/keypin"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The attack on a Mac's node credential (docs/security.md, "Node credentials"): a
// copy of it, taken elsewhere, must not become that Mac on the data plane.

// TestAttackStolenNodeCredentialGetsACertificate: an attacker copies a running Mac's
// node token (the kubeconfig its agent runs with) and asks the signer for that Mac's
// certificate over a key of its own, without and with a rotation proof signed by that
// key; it must get Denied requests naming the fix and no certificate, while the Mac
// itself, restarted, still gets certificates and rotates its key.
func TestAttackStolenNodeCredentialGetsACertificate(t *testing.T) {
	node := localfleetNode(0)
	stolen, err := os.ReadFile(fleet.Agent(node).Kubeconfig) // what an attacker on the Mac copies
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(stolen)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	forged, err := keypin.Prove(key, node, key.Public())
	if err != nil {
		t.Fatal(err)
	}
	for _, proof := range []string{"", forged} {
		certPEM, name, err := certs.Ask(t.Context(), cs, node, key, proof, time.Hour, time.Minute)
		if len(certPEM) > 0 || err == nil || !strings.Contains(err.Error(), "was Denied") {
			t.Errorf("the stolen token of %s asking for the attacker's key (proof %t): %d certificate bytes, %v; want Denied and none",
				node, proof != "", len(certPEM), err)
			continue
		}
		var csr certv1.CertificateSigningRequest
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Name: name}, &csr); err != nil {
			t.Fatal(err)
		}
		c := csr.Status.Conditions[0]
		if len(csr.Status.Certificate) > 0 || c.Reason != certsigner.ReasonNotPinnedKey || !strings.Contains(c.Message, "macfleet nodes revoke "+node) {
			t.Errorf("the attacker's request %s: %s %s %q, %d certificate bytes; want %s naming the fix and no certificate",
				name, c.Type, c.Reason, c.Message, len(csr.Status.Certificate), certsigner.ReasonNotPinnedKey)
		}
	}

	// The Mac keeps getting certificates: restarted, its agent reads its key and
	// rotates to a new one that the old one vouches for.
	before := pinOf(t, node)
	if err := fleet.StopAgent(node, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := fleet.StartAgent(node); err != nil {
		t.Fatal(err)
	}
	if err := fleet.WaitNodeReady(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	caller, err := fleet.AgentClient(t.Context(), new(pki.Gateway("e2e-gateway")))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		served, err := servedKey(caller, fleet.Agent(node).Addr)
		if err != nil {
			return false, "the restarted agent's certificate: " + err.Error()
		}
		pin := pinOf(t, node)
		return pin != before && served == pin, fmt.Sprintf("pin %s before the restart, %s after; the agent serves key %s", before, pin, served)
	})
}

// pinOf is the key pinned to node (keypin.PinAnnotation on its binding Secret).
func pinOf(t *testing.T, node string) string {
	t.Helper()
	var s corev1.Secret
	if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: v1alpha1.NodeIdentityNamespace, Name: credentials.BindingSecretName(node)}, &s); err != nil {
		t.Fatal(err)
	}
	return s.Annotations[keypin.PinAnnotation]
}

// servedKey is the fingerprint of the key an agent serves TLS with.
func servedKey(hc *http.Client, addr string) (string, error) {
	resp, err := hc.Get(localfleet.AgentURL(addr) + "/healthz")
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 {
		return "", fmt.Errorf("no TLS certificate from %s", addr)
	}
	return keypin.Fingerprint(resp.TLS.PeerCertificates[0].PublicKey)
}

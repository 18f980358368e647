package localfleet

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// shippedKubeconfigPath is the webhook kubeconfig path in
// config/authorization/authorization-config.yaml, replaced by the fleet's own.
const shippedKubeconfigPath = "/etc/kubernetes/macfleet/node-authorizer.kubeconfig"

// NodeAuthorizer is what an API server and a manager need to use the node authorizer
// webhook on this machine.
type NodeAuthorizer struct {
	// AuthorizationConfig is the file for testenv.WithAuthorizationConfig: the shipped
	// config/authorization/authorization-config.yaml pointing at URL.
	AuthorizationConfig string
	// CertDir holds the webhook's tls.crt and tls.key (the manager's
	// --node-authorizer-cert-dir); the certificate is its own CA.
	CertDir string
	// ClientCA is the CA of the client certificate the API server presents (the
	// manager's --node-authorizer-client-ca); ClientCert and ClientKey are another
	// certificate it signs and its key, for tests that call the webhook themselves.
	ClientCA, ClientCert, ClientKey string
	// URL is where the API server sends its SubjectAccessReviews.
	URL string
}

// WriteNodeAuthorizer writes, under dir, a self-signed certificate for 127.0.0.1, a
// client CA and a client certificate it signs for the API server, a kubeconfig
// reaching the webhook at https://addr/authorize with both, and the shipped
// authorization configuration naming that kubeconfig.
func WriteNodeAuthorizer(dir, addr string) (NodeAuthorizer, error) {
	na := NodeAuthorizer{CertDir: filepath.Join(dir, "node-authorizer-tls"), URL: "https://" + addr + "/authorize"}
	if err := os.MkdirAll(na.CertDir, 0o700); err != nil {
		return na, err
	}
	now := time.Now()
	server, err := newKeyPair(&x509.Certificate{
		Subject: pkix.Name{CommonName: "macfleet-node-authorizer"}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}, nil)
	if err != nil {
		return na, fmt.Errorf("the node authorizer's certificate: %w", err)
	}
	clientCA, err := newKeyPair(&x509.Certificate{
		Subject: pkix.Name{CommonName: "macfleet-node-authorizer-client-ca"}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}, nil)
	if err != nil {
		return na, fmt.Errorf("the node authorizer's client CA: %w", err)
	}
	clientTmpl := func(name string) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: name}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	}
	apiserver, err := newKeyPair(clientTmpl("kube-apiserver"), clientCA)
	if err != nil {
		return na, fmt.Errorf("the API server's client certificate: %w", err)
	}
	other, err := newKeyPair(clientTmpl("test-client"), clientCA)
	if err != nil {
		return na, fmt.Errorf("a test client certificate: %w", err)
	}
	na.ClientCA = filepath.Join(dir, "node-authorizer-client-ca.crt")
	na.ClientCert, na.ClientKey = filepath.Join(dir, "node-authorizer-test-client.crt"), filepath.Join(dir, "node-authorizer-test-client.key")
	for path, b := range map[string][]byte{
		filepath.Join(na.CertDir, "tls.crt"): server.certPEM, filepath.Join(na.CertDir, "tls.key"): server.keyPEM,
		na.ClientCA: clientCA.certPEM, na.ClientCert: other.certPEM, na.ClientKey: other.keyPEM,
	} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return na, err
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["node-authorizer"] = &clientcmdapi.Cluster{Server: na.URL, CertificateAuthorityData: server.certPEM}
	kc.AuthInfos["kube-apiserver"] = &clientcmdapi.AuthInfo{ClientCertificateData: apiserver.certPEM, ClientKeyData: apiserver.keyPEM}
	kc.Contexts["default"] = &clientcmdapi.Context{Cluster: "node-authorizer", AuthInfo: "kube-apiserver"}
	kc.CurrentContext = "default"
	kubeconfig := filepath.Join(dir, "node-authorizer.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return na, err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return na, err
	}
	shipped, err := os.ReadFile(filepath.Join(root, "config", "authorization", "authorization-config.yaml"))
	if err != nil {
		return na, err
	}
	if !bytes.Contains(shipped, []byte(shippedKubeconfigPath)) {
		return na, fmt.Errorf("config/authorization/authorization-config.yaml no longer names %s", shippedKubeconfigPath)
	}
	na.AuthorizationConfig = filepath.Join(dir, "authorization-config.yaml")
	return na, os.WriteFile(na.AuthorizationConfig, bytes.ReplaceAll(shipped, []byte(shippedKubeconfigPath), []byte(kubeconfig)), 0o600)
}

// keyPair is a certificate and its key, parsed and in PEM.
type keyPair struct {
	cert            *x509.Certificate
	key             *ecdsa.PrivateKey
	certPEM, keyPEM []byte
}

// newKeyPair creates a P-256 key and a certificate of tmpl for it, signed by parent
// (nil: self-signed), with a random serial number.
func newKeyPair(tmpl *x509.Certificate, parent *keyPair) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62)); err != nil {
		return nil, err
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &keyPair{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}, nil
}

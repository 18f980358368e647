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

	"github.com/macfleet/macfleet/internal/testenv"
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
	// URL is where the API server sends its SubjectAccessReviews.
	URL string
}

// WriteNodeAuthorizer writes, under dir, a self-signed certificate for 127.0.0.1, a
// kubeconfig reaching the webhook at https://addr/authorize with it, and the shipped
// authorization configuration naming that kubeconfig.
func WriteNodeAuthorizer(dir, addr string) (NodeAuthorizer, error) {
	na := NodeAuthorizer{CertDir: filepath.Join(dir, "node-authorizer-tls"), URL: "https://" + addr + "/authorize"}
	if err := os.MkdirAll(na.CertDir, 0o700); err != nil {
		return na, err
	}
	ca, err := writeSelfSignedCert(na.CertDir)
	if err != nil {
		return na, fmt.Errorf("the node authorizer's certificate: %w", err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["node-authorizer"] = &clientcmdapi.Cluster{Server: na.URL, CertificateAuthorityData: ca}
	kc.AuthInfos["kube-apiserver"] = &clientcmdapi.AuthInfo{}
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

// writeSelfSignedCert writes tls.crt and tls.key for 127.0.0.1 into dir and returns
// the certificate in PEM, which is also its CA.
func writeSelfSignedCert(dir string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "macfleet-node-authorizer"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	crt := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), crt, 0o600); err != nil {
		return nil, err
	}
	return crt, os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
}

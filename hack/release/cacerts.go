package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/macfleet/macfleet/internal/ociimage"
)

// imageCABundle is where the image carries its CA roots; the entrypoint's environment
// names it in SSL_CERT_FILE. Without it every https download in the cluster (hf://,
// the model hub) fails on an unknown authority.
const imageCABundle = "/etc/ssl/certs/ca-certificates.crt"

// SystemCABundles are where the machines a release is built on keep their CA bundle:
// Debian and Ubuntu, Fedora and RHEL, openSUSE, macOS and Alpine.
var SystemCABundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/ssl/cert.pem",
}

// caBundle is the CA bundle the image gets: the one named (CA_CERTS), else the first
// of candidates that exists. It fails, naming the fix, where there is none.
func caBundle(named string, candidates []string) (string, error) {
	if named != "" {
		return named, nil
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			return c, nil
		}
	}
	return "", fmt.Errorf("no CA bundle on this machine (looked for %s): the image needs CA roots for "+
		"its https downloads; name a PEM bundle with CA_CERTS=FILE (make release CA_CERTS=FILE)",
		strings.Join(candidates, ", "))
}

// parseCABundle returns the certificates of a PEM bundle, failing where it holds none
// or a block that is not a certificate.
func parseCABundle(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a %q block where certificates belong", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate in it")
	}
	return certs, nil
}

// checkCABundleFile says why the file at name would leave the image without CA roots.
func checkCABundleFile(name string) error {
	b, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	if _, err := parseCABundle(b); err != nil {
		return fmt.Errorf("the CA bundle %s: %w", name, err)
	}
	return nil
}

// checkImageCACerts says why a platform's image has no usable CA roots: the bundle is
// missing, holds no certificate, or the environment does not point Go at it.
func checkImageCACerts(p ociimage.PlatformImage) error {
	f, ok := p.Files[imageCABundle]
	if !ok {
		return fmt.Errorf("no CA bundle at %s: https downloads in the cluster would fail", imageCABundle)
	}
	if _, err := parseCABundle(f.Data); err != nil {
		return fmt.Errorf("the CA bundle at %s: %w", imageCABundle, err)
	}
	if !slices.Contains(p.Config.Config.Env, "SSL_CERT_FILE="+imageCABundle) {
		return fmt.Errorf("the environment lacks SSL_CERT_FILE=%s", imageCABundle)
	}
	return nil
}

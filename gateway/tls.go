package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// DefaultTLSPoll is how often the serving certificate's files are re-read besides the
// file system's change events (a Secret mounted as files changes by a swap of its
// directory, which some file systems do not report).
const DefaultTLSPoll = 10 * time.Second

// servingTLS is the API's own TLS: a certificate and key read from files and re-read
// when they change (a certificate issuer rotating a mounted Secret), TLS 1.2 at
// least, and HTTP/1.1 only, so that the connection caps keep counting one client's
// streams (one multiplexed connection would carry any number).
type servingTLS struct {
	watcher *certwatcher.CertWatcher
	config  *tls.Config
}

// newServingTLS loads certFile and keyFile (both or neither; neither is plain HTTP,
// nil) and reports each certificate served on the expiry gauge and in the log.
func newServingTLS(certFile, keyFile string, poll time.Duration, reg prometheus.Registerer, log logr.Logger) (*servingTLS, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, errors.New("the API's TLS needs both a certificate file (--tls-cert-file) and its key file (--tls-key-file)")
	}
	if poll <= 0 {
		poll = DefaultTLSPoll
	}
	w, err := certwatcher.New(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the API's TLS certificate (--tls-cert-file %s, --tls-key-file %s): %w", certFile, keyFile, err)
	}
	expiry, err := register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "macfleet_gateway_tls_certificate_expiry_timestamp_seconds",
		Help: "When the certificate the gateway's API serves over TLS expires (Unix seconds); absent when the API serves plain HTTP.",
	}))
	if err != nil {
		return nil, err
	}
	w.WithWatchInterval(poll).RegisterCallback(func(c tls.Certificate) {
		leaf := c.Leaf
		if leaf == nil {
			var perr error
			if leaf, perr = x509.ParseCertificate(c.Certificate[0]); perr != nil {
				log.Error(perr, "Parsing the API's TLS certificate")
				return
			}
		}
		expiry.(prometheus.Gauge).Set(float64(leaf.NotAfter.Unix()))
		log.Info("Serving the API over TLS with a certificate", "subject", leaf.Subject.String(), "dnsNames", leaf.DNSNames,
			"notAfter", leaf.NotAfter.UTC(), "certFile", certFile)
	})
	return &servingTLS{watcher: w, config: &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"http/1.1"},
		GetCertificate: w.GetCertificate,
	}}, nil
}

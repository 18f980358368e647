package nodeauthz

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/macfleet/macfleet/internal/httpserver"
)

// Path is where the webhook answers; the API server's kubeconfig for it names it.
const Path = "/authorize"

// decisions counts the webhook's answers.
var decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "macfleet_manager_node_authorizer_decisions_total",
	Help: "SubjectAccessReviews of node identities answered by the node authorizer, by decision (allowed, denied, no-opinion).",
}, []string{"decision"})

func init() { metrics.Registry.MustRegister(decisions) }

// Options configure the webhook server.
type Options struct {
	// Listener is where it serves HTTPS.
	Listener net.Listener
	// CertDir holds tls.crt and tls.key, reloaded when they change. The API server's
	// kubeconfig for the webhook trusts their issuer.
	CertDir string
	// ClientCAFile, when set, is a PEM bundle of the CAs whose client certificates
	// may ask: the connection of a caller without one (anyone but the API server, whose
	// kubeconfig for the webhook presents one) fails its TLS handshake. It is read at
	// start.
	ClientCAFile string
}

// TLSConfig is the webhook's server TLS: its certificate from getCert and, with
// clientCAFile, a client certificate required of every caller and verified against
// that file's CAs.
func TLSConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCert}
	if clientCAFile == "" {
		return cfg, nil
	}
	pemCAs, err := os.ReadFile(clientCAFile)
	if err != nil {
		return nil, fmt.Errorf("reading the node authorizer's client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemCAs) {
		return nil, fmt.Errorf("the node authorizer's client CA file %s holds no PEM certificate", clientCAFile)
	}
	cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, pool
	return cfg, nil
}

// Add makes the manager serve the webhook on every replica (not only the leader: the
// API server may reach any of them), answering from the manager's cache.
func Add(mgr manager.Manager, o Options) error {
	if o.Listener == nil || o.CertDir == "" {
		return errors.New("nodeauthz: the webhook needs a listener and a certificate directory")
	}
	cw, err := certwatcher.New(filepath.Join(o.CertDir, "tls.crt"), filepath.Join(o.CertDir, "tls.key"))
	if err != nil {
		return fmt.Errorf("loading the node authorizer's certificate from %s: %w", o.CertDir, err)
	}
	if err := mgr.Add(cw); err != nil {
		return err
	}
	log := ctrl.Log.WithName("node-authorizer")
	mux := http.NewServeMux()
	mux.Handle(Path, &Handler{Lookup: CacheLookup(mgr.GetCache(), log), Log: log, Decisions: decisions})
	tlsCfg, err := TLSConfig(cw.GetCertificate, o.ClientCAFile)
	if err != nil {
		return err
	}
	// The connection cap is beneath TLS, so that the server still sees TLS connections.
	ln := tls.NewListener(httpserver.Listener(o.Listener, httpserver.Limits{}), tlsCfg)
	grace := 30 * time.Second
	return mgr.Add(&manager.Server{Name: "node authorizer", Listener: ln, ShutdownTimeout: &grace,
		Server: httpserver.New(mux, httpserver.Limits{})})
}

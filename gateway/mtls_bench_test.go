package gateway

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/pki"
)

// BenchmarkMutualTLS measures what calling agents over mutual TLS adds to the
// gateway's hot path: two gateways in front of the same trivial upstream handler, one
// over plain HTTP and one over TLS with the agent's certificate checked against the
// Mac the replica is bound to and the gateway's client certificate checked by the
// upstream (pki.Source's configs, as the agent and the gateway use them), compared as
// in compareEndpoints. Connections are kept, so the handshake is paid once per
// connection, not per request.
func BenchmarkMutualTLS(b *testing.B) {
	ca, err := pki.NewCA(time.Now(), 24*time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	agentCert, gatewayCert := benchSource(b, ca, pki.Node("mac")), benchSource(b, ca, pki.Gateway("gw"))
	const answer = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`
	var overTLS atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.TLS != nil {
			overTLS.Add(1)
			if id, ok := pki.PeerIdentity(r.TLS); !ok || id.Kind != pki.KindGateway {
				http.Error(w, "no gateway certificate", http.StatusUnauthorized)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	})
	plain := httptest.NewServer(handler)
	b.Cleanup(plain.Close)
	secure := httptest.NewUnstartedServer(handler)
	secure.Listener = tls.NewListener(secure.Listener, agentCert.ServerConfig())
	secure.Start()
	b.Cleanup(secure.Close)
	httpGW := newBenchGateway(b, plain.URL, Options{})
	// secure.URL says http:// (httptest does not know of the TLS listener); the
	// gateway calls it over https because it has certificates.
	mtlsGW := newBenchGateway(b, secure.URL, Options{AgentCertificates: gatewayCert})
	compareEndpoints(b, newBenchClient(b), "http", httpGW, "mtls", mtlsGW)
	if overTLS.Load() == 0 {
		b.Fatal("no request reached the upstream over TLS")
	}
}

func benchSource(b *testing.B, ca *pki.CA, id pki.Identity) *pki.Source {
	b.Helper()
	src, err := ca.NewSource(&id, time.Now(), time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	return src
}

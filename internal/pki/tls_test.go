package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// source is a Source trusting the CAs of bundle, holding a certificate of ca for id.
func source(t *testing.T, ca *CA, id Identity, bundle ...*x509.Certificate) *Source {
	t.Helper()
	s, err := ca.NewSource(&id, time.Now(), DefaultLeafLifetime)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetBundle(EncodeCerts(bundle...)); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMutualTLS runs a real TLS server with ServerConfig and calls it through
// Transports: the caller's identity reaches the handler, a server that is not the Mac
// meant or a caller of another CA fails the handshake.
func TestMutualTLS(t *testing.T) {
	ca, rogue := mustCA(t, time.Now()), mustCA(t, time.Now())
	agent := source(t, ca, Node("mac-1"), ca.Cert)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := PeerIdentity(r.TLS)
		if !ok {
			io.WriteString(w, "anonymous")
			return
		}
		io.WriteString(w, id.String())
	}))
	// Served as the agent does: a TLS listener of ServerConfig (httptest's StartTLS
	// would put its own certificate first).
	srv.Listener = tls.NewListener(srv.Listener, agent.ServerConfig())
	srv.Start()
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	call := func(src *Source, node string) (string, error) {
		req, _ := http.NewRequestWithContext(WithNode(context.Background(), node), http.MethodGet, "https://"+host+"/", nil)
		tr := NewTransports(src, nil)
		defer tr.CloseIdleConnections()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	gw := source(t, ca, Gateway("gw-1"), ca.Cert)
	if got, err := call(gw, "mac-1"); err != nil || got != "macfleet://gateway/gw-1" {
		t.Fatalf("gateway → mac-1: %q, %v; want the gateway's identity", got, err)
	}
	if got, err := call(gw, "mac-2"); err == nil || !strings.Contains(err.Error(), "not macfleet://node/mac-2") {
		t.Fatalf("gateway → mac-2 at mac-1's address: %q, %v; want a refused handshake", got, err)
	}
	// A client of another CA is refused by the server; one without a certificate is
	// anonymous (it may still carry a tenant's token).
	stranger := source(t, rogue, Gateway("gw-1"), ca.Cert)
	if got, err := call(stranger, "mac-1"); err == nil {
		t.Fatalf("a gateway certificate of another CA was served: %q", got)
	}
	if got, err := call(&Source{}, "mac-1"); err == nil {
		t.Fatalf("a caller with no bundle trusted the server: %q", got)
	}
	anon := &Source{}
	if err := anon.SetBundle(EncodeCerts(ca.Cert)); err != nil {
		t.Fatal(err)
	}
	if got, err := call(anon, "mac-1"); err != nil || got != "anonymous" {
		t.Fatalf("a caller without a certificate: %q, %v; want anonymous", got, err)
	}
	// No node named: nothing is sent.
	req, _ := http.NewRequest(http.MethodGet, "https://"+host, nil)
	if _, err := NewTransports(gw, nil).RoundTrip(req); err == nil || !strings.Contains(err.Error(), "names no Mac") {
		t.Fatalf("a request without a node: %v", err)
	}
	// Plain HTTP to the TLS listener gets no answer.
	if resp, err := http.Get("http://" + host + "/"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP was served")
		}
	}
}

// Package certsignertest runs the manager's certificate authority and CSR signer
// (package certsigner) against a test's API server, for tests of the agents and
// callers that need certificates from it.
package certsignertest

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/macfleet/macfleet/controllers/certsigner"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// Start runs the authority (issuing the gateway identity "macfleet-gateway") and the
// signer in a manager until the test ends, and waits for the CA. The namespace
// macfleet-system must exist. Each of tune, if any, adjusts the signer before it
// starts.
func Start(t *testing.T, e *testenv.Env, tune ...func(*certsigner.Signer)) *certsigner.Authority {
	t.Helper()
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{Scheme: e.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: new(true)}})
	if err != nil {
		t.Fatal(err)
	}
	a := &certsigner.Authority{Client: e.Client, GatewayName: "macfleet-gateway", Log: ctrl.Log.WithName("certsigner")}
	if err := mgr.Add(a); err != nil {
		t.Fatal(err)
	}
	signer := &certsigner.Signer{Authority: a}
	for _, f := range tune {
		f(signer)
	}
	if err := signer.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the certificate signer's manager: %v", err)
		}
	})
	select {
	case <-a.Loaded():
	case err := <-done:
		t.Fatalf("the certificate signer's manager stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the fleet CA was not loaded within 30s")
	}
	return a
}

// Source is a pki.Source holding a new certificate for id from a, and a's bundle.
func Source(t *testing.T, a *certsigner.Authority, id pki.Identity) *pki.Source {
	t.Helper()
	certPEM, keyPEM, err := a.IssuePEM(id)
	if err != nil {
		t.Fatal(err)
	}
	src := &pki.Source{}
	if err := src.SetCertificate(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	if err := src.SetBundle(pki.EncodeCerts(a.Bundle()...)); err != nil {
		t.Fatal(err)
	}
	return src
}

// ServeTLS plays the TLS side of an agent holding src's certificate until the test
// ends: it listens on host (a free port), finishes each handshake with
// src.ServerConfig() and returns the listener's host:port.
func ServeTLS(t testing.TB, src *pki.Source, host string) string {
	t.Helper()
	ln, err := tls.Listen("tcp", net.JoinHostPort(host, "0"), src.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.(*tls.Conn).Handshake()
				_, _ = conn.Read(make([]byte, 1))
			}()
		}
	}()
	return ln.Addr().String()
}

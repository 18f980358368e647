package pki

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustCA(t *testing.T, at time.Time) *CA {
	t.Helper()
	ca, err := NewCA(at, DefaultCALifetime)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustLeaf(t *testing.T, ca *CA, id Identity, at time.Time) *x509.Certificate {
	t.Helper()
	c, _ := mustKeyAndLeaf(t, ca, id, at)
	return c
}

// mustKeyAndLeaf is a new key and a certificate of ca for id over it.
func mustKeyAndLeaf(t *testing.T, ca *CA, id Identity, at time.Time) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.Issue(key.Public(), id, at, DefaultLeafLifetime)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func TestIdentityRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		uri     string
		want    Identity
		wantErr string
	}{
		{uri: "macfleet://node/mac-1", want: Node("mac-1")},
		{uri: "macfleet://gateway/macfleet-gateway-7c9", want: Gateway("macfleet-gateway-7c9")},
		{uri: "macfleet://manager/macfleet-manager", want: Manager("macfleet-manager")},
		{uri: "macfleet://metrics/prometheus", want: Metrics("prometheus")},
		{uri: "macfleet://metrics/", wantErr: "not a Kubernetes object name"},
		{uri: "macfleet://tenant/x", wantErr: "unknown identity kind"},
		{uri: "macfleet://node/", wantErr: "not a Kubernetes object name"},
		{uri: "macfleet://node/a/b", wantErr: "not a Kubernetes object name"},
		{uri: "https://node/mac-1", wantErr: "is not a macfleet:// identity"},
		{uri: "macfleet://node/mac-1?x=1", wantErr: "is not a macfleet:// identity"},
	} {
		u, err := url.Parse(tc.uri)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseIdentity(u)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseIdentity(%s) = %v, %v; want error %q", tc.uri, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want || got.String() != tc.uri {
			t.Errorf("ParseIdentity(%s) = %v (%s), %v; want %v", tc.uri, got, got, err, tc.want)
		}
	}
}

func TestIssueAndVerify(t *testing.T) {
	ca, other := mustCA(t, t0), mustCA(t, t0)
	leaf := mustLeaf(t, ca, Node("mac-1"), t0)
	roots := Pool([]*x509.Certificate{ca.Cert})
	at := t0.Add(time.Hour)

	if id, err := Verify([]*x509.Certificate{leaf}, roots, at, x509.ExtKeyUsageClientAuth); err != nil || id != Node("mac-1") {
		t.Fatalf("Verify = %v, %v; want node mac-1", id, err)
	}
	for _, tc := range []struct {
		name    string
		chain   []*x509.Certificate
		roots   *x509.CertPool
		at      time.Time
		want    Identity
		wantErr string
	}{
		{name: "the Mac meant", chain: []*x509.Certificate{leaf}, roots: roots, at: at, want: Node("mac-1")},
		{name: "another Mac", chain: []*x509.Certificate{leaf}, roots: roots, at: at, want: Node("mac-2"), wantErr: "not macfleet://node/mac-2"},
		{name: "another CA", chain: []*x509.Certificate{mustLeaf(t, other, Node("mac-1"), t0)}, roots: roots, at: at, want: Node("mac-1"), wantErr: "not from the fleet CA"},
		{name: "expired", chain: []*x509.Certificate{leaf}, roots: roots, at: t0.Add(25 * time.Hour), want: Node("mac-1"), wantErr: "expired"},
		{name: "no certificate", roots: roots, at: at, want: Node("mac-1"), wantErr: "no certificate"},
		{name: "no bundle yet", chain: []*x509.Certificate{leaf}, at: at, want: Node("mac-1"), wantErr: "no fleet CA bundle"},
	} {
		err := VerifyServer(tc.chain, tc.roots, tc.at, tc.want)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: VerifyServer = %v; want error %q", tc.name, err, tc.wantErr)
		}
	}
	// A leaf never outlives its CA.
	short, err := NewCA(t0, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if c := mustLeaf(t, short, Gateway("g"), t0); !c.NotAfter.Equal(short.Cert.NotAfter) {
		t.Errorf("leaf NotAfter %v, want the CA's %v", c.NotAfter, short.Cert.NotAfter)
	}
}

func TestIdentityOfRefusesExtraNames(t *testing.T) {
	ca := mustCA(t, t0)
	key, _ := NewKey()
	tmpl := &x509.Certificate{SerialNumber: ca.Cert.SerialNumber, NotBefore: t0, NotAfter: t0.Add(time.Hour),
		URIs: []*url.URL{Node("mac-1").URI()}, IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	if id, err := IdentityOf(c); err == nil {
		t.Fatalf("IdentityOf a certificate with an IP SAN = %v; want an error", id)
	}
}

func TestCheckCSR(t *testing.T) {
	key, _ := NewKey()
	csrWith := func(tmpl *x509.CertificateRequest, k any) []byte {
		der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	}
	good, err := NewCSR(key, Node("mac-1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		csr     []byte
		wantErr string
	}{
		{name: "its own name", csr: good},
		{name: "another Mac", csr: csrWith(&x509.CertificateRequest{URIs: []*url.URL{Node("mac-2").URI()}}, key), wantErr: "must name exactly macfleet://node/mac-1"},
		{name: "a gateway", csr: csrWith(&x509.CertificateRequest{URIs: []*url.URL{Gateway("mac-1").URI()}}, key), wantErr: "must name exactly"},
		{name: "two names", csr: csrWith(&x509.CertificateRequest{URIs: []*url.URL{Node("mac-1").URI(), Gateway("g").URI()}}, key), wantErr: "must name exactly"},
		{name: "an extra DNS name", csr: csrWith(&x509.CertificateRequest{URIs: []*url.URL{Node("mac-1").URI()}, DNSNames: []string{"gw"}}, key), wantErr: "nothing else"},
		{name: "another common name", csr: csrWith(&x509.CertificateRequest{Subject: pkix.Name{CommonName: "mac-2"}, URIs: []*url.URL{Node("mac-1").URI()}}, key), wantErr: "common name"},
		{name: "not PEM", csr: []byte("hello"), wantErr: "no PEM CERTIFICATE REQUEST"},
	} {
		_, err := CheckCSR(tc.csr, Node("mac-1"))
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: CheckCSR = %v; want error %q", tc.name, err, tc.wantErr)
		}
	}
}

func TestKeyAndCARoundTrip(t *testing.T) {
	ca := mustCA(t, t0)
	kp, err := EncodeKey(ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseCA(EncodeCerts(ca.Cert), kp)
	if err != nil || !back.Cert.Equal(ca.Cert) {
		t.Fatalf("ParseCA = %v; want the same CA", err)
	}
	other, _ := NewKey()
	op, _ := EncodeKey(other)
	if _, err := ParseCA(EncodeCerts(ca.Cert), op); err == nil {
		t.Fatal("ParseCA with another key: want an error")
	}
	var _ *ecdsa.PrivateKey = back.Key
}

func TestRenewAt(t *testing.T) {
	c := mustLeaf(t, mustCA(t, t0), Node("mac-1"), t0)
	// Backdated 5 minutes: lifetime 24h05m, renewed 2/3 in.
	want := t0.Add(-backdate).Add((DefaultLeafLifetime + backdate) * 2 / 3)
	if got := RenewAt(c); !got.Equal(want) {
		t.Errorf("RenewAt = %v, want %v", got, want)
	}
}

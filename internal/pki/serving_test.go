package pki

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

// TestIssueServing: a serving certificate verifies for its hosts as HTTPS does, and
// for no other name; it cannot be used as a client, and no identity check takes it
// for one of the fleet's identities.
func TestIssueServing(t *testing.T) {
	ca := mustCA(t, t0)
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	hosts := []string{"LLM.example.com", "macfleet-gateway.macfleet-system.svc", "10.0.0.7", "*.teams.example.com"}
	c, err := ca.IssueServing(key.Public(), hosts, t0, DefaultLeafLifetime)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	at := t0.Add(time.Hour)
	for _, name := range []string{"llm.example.com", "macfleet-gateway.macfleet-system.svc", "10.0.0.7", "a.teams.example.com"} {
		if _, err := c.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, CurrentTime: at}); err != nil {
			t.Errorf("HTTPS to %s: %v", name, err)
		}
	}
	for _, name := range []string{"evil.example.com", "10.0.0.8", "teams.example.com"} {
		if _, err := c.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, CurrentTime: at}); err == nil {
			t.Errorf("HTTPS to %s verifies with a certificate not issued for it", name)
		}
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("a serving certificate verifies as a client's")
	}
	if id, err := Verify([]*x509.Certificate{c}, roots, at, x509.ExtKeyUsageServerAuth); err == nil {
		t.Errorf("a serving certificate passes as identity %s", id)
	}
	if !ServesExactly(c, []string{"10.0.0.7", "*.teams.example.com", "llm.example.com", "macfleet-gateway.macfleet-system.svc"}) {
		t.Error("ServesExactly misses the same hosts in another order and case")
	}
	if ServesExactly(c, hosts[:3]) || ServesExactly(c, append(hosts, "more.example.com")) {
		t.Error("ServesExactly matches another list of hosts")
	}
	if ServesExactly(mustLeaf(t, ca, Gateway("gw"), t0), nil) {
		t.Error("ServesExactly takes an identity's certificate for a serving one")
	}
	if c.NotAfter.After(ca.Cert.NotAfter) || !c.NotAfter.Equal(t0.Add(DefaultLeafLifetime)) {
		t.Errorf("valid until %v, want %v", c.NotAfter, t0.Add(DefaultLeafLifetime))
	}
}

func TestValidHosts(t *testing.T) {
	for _, tc := range []struct {
		hosts   []string
		wantErr string
	}{
		{hosts: []string{"llm.example.com", "::1", "*.example.com", "gw"}},
		{hosts: nil, wantErr: "at least one"},
		{hosts: []string{"a.example.com", "A.example.com"}, wantErr: "named twice"},
		{hosts: []string{"under_score.example.com"}, wantErr: "not a letter"},
		{hosts: []string{"-a.example.com"}, wantErr: "hyphen"},
		{hosts: []string{"a..example.com"}, wantErr: "labels"},
		{hosts: []string{"*.*.example.com"}, wantErr: "not a letter"},
		{hosts: []string{"https://llm.example.com"}, wantErr: "not a letter"},
		{hosts: []string{strings.Repeat("a", 64) + ".com"}, wantErr: "labels"},
	} {
		err := ValidHosts(tc.hosts)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("ValidHosts(%q) = %v, want %q", tc.hosts, err, tc.wantErr)
		}
	}
	ca := mustCA(t, t0)
	key, _ := NewKey()
	if _, err := ca.IssueServing(key.Public(), []string{"bad host"}, t0, time.Hour); err == nil {
		t.Error("a serving certificate is issued for an invalid host")
	}
}

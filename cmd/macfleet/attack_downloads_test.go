package main

import (
	"context"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/agent/clustermode"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

const attackNS = "team-b"

// shippedStore opens a model store in a fresh directory exactly as `macfleet agent`
// does (agentFlags.newStore with the flags' defaults), under a SourcePolicy of spec.
func shippedStore(t *testing.T, spec v1alpha1.SourcePolicySpec) interface {
	Fetch(ctx context.Context, namespace, rawSource, sha256 string, progress func(done, total int64)) (string, error)
} {
	t.Helper()
	p, err := sourcepolicy.Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SourcePolicyName}, Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	fl := agentFlags{opts: clustermode.Options{StoreDir: t.TempDir()}, hfEndpoint: modelsource.DefaultHFEndpoint, ollamaRegistry: modelsource.DefaultOllamaRegistry}
	st, err := fl.newStore(sourcepolicy.NewHolder(p), nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// redirector answers every request with a redirect to target.
func redirector(t *testing.T, target string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target, http.StatusFound)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func wantDeniedNaming(t *testing.T, err error, want ...string) {
	t.Helper()
	if !sourcepolicy.IsDenied(err) {
		t.Fatalf("Fetch: %v; want a source policy denial", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the denial %q does not contain %q", err, w)
		}
	}
}

// TestAttackRedirectIntoTheLAN: a tenant's source on a host the SourcePolicy allows
// answers with a redirect to an address in the Macs' LAN (RFC 1918, ULA, CGNAT,
// NAT64), hoping for a blind GET from the agent; the agent's store, built as the
// command builds it, must refuse the redirect before it connects, with a denial that
// names the policy field that would allow it.
func TestAttackRedirectIntoTheLAN(t *testing.T) {
	for _, tc := range []struct {
		name, target string
		// listed: the policy's hosts list the target too, so only the dial-time
		// address check stands in the way.
		listed bool
		want   []string
	}{
		{"unlisted RFC 1918 host", "http://10.20.30.40:8080/admin", false,
			[]string{`source host "10.20.30.40" is not allowed for namespace "team-b"`, "spec.rules[].hosts"}},
		{"listed RFC 1918 host", "http://10.20.30.40:8080/admin", true,
			[]string{"10.20.30.40 is private (RFC 1918)", "add 10.20.30.40/32 to spec.allowedNetworks"}},
		{"listed 192.168 host", "http://192.168.1.1/cgi-bin/reboot", true, []string{"192.168.1.1 is private (RFC 1918)", "spec.allowedNetworks"}},
		{"listed ULA host", "http://[fd12:3456::1]:8080/m.gguf", true, []string{"fd12:3456::1 is unique local (ULA)", "add fd12:3456::1/128 to spec.allowedNetworks"}},
		{"listed CGNAT host", "http://100.64.7.7/m.gguf", true, []string{"100.64.7.7 is shared address space (CGNAT)", "spec.allowedNetworks"}},
		{"listed NAT64 host", "http://[64:ff9b::a14:1e28]/m.gguf", true, []string{"64:ff9b::a14:1e28 is NAT64", "spec.allowedNetworks"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redirector(t, tc.target)
			u, _ := url.Parse(tc.target)
			hosts := []string{"127.0.0.1"}
			if tc.listed {
				hosts = append(hosts, u.Hostname())
			}
			st := shippedStore(t, v1alpha1.SourcePolicySpec{
				Rules: []v1alpha1.SourcePolicyRule{{Namespaces: []string{attackNS}, Hosts: hosts, AllowPlainHTTP: true}},
				// The open redirector itself is on loopback, which the policy allows.
				AllowedNetworks: []string{"127.0.0.0/8"},
			})
			// Without the denial the store would dial the LAN address: the timeout
			// keeps that failure short.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			_, err := st.Fetch(ctx, attackNS, srv.URL+"/m.gguf", "", nil)
			wantDeniedNaming(t, err, tc.want...)
		})
	}
}

// downgradeChildEnv marks the process TestAttackRedirectToPlainHTTP runs in: it
// trusts the test's TLS server through SSL_CERT_FILE, which the system roots are read
// from once per process.
const downgradeChildEnv = "MACFLEET_TEST_DOWNGRADE_CHILD"

// TestAttackRedirectToPlainHTTP: a tenant's https:// source redirects to plain http://
// (on a host whose rule even allows plain HTTP), so that anyone on the path can swap
// the file; the agent's store, built as the command builds it and trusting the
// source's certificate as a system root, must refuse the downgrade and say how to fix
// the source.
func TestAttackRedirectToPlainHTTP(t *testing.T) {
	if os.Getenv(downgradeChildEnv) == "" {
		// The system roots are loaded once per process: run in a fresh one.
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestAttackRedirectToPlainHTTP$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), downgradeChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the attack in its own process: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "--- PASS: TestAttackRedirectToPlainHTTP") {
			t.Fatalf("the attack did not run in its own process:\n%s", out)
		}
		return
	}

	content := append([]byte("GGUF"), make([]byte, 4096)...)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(content)
	}))
	t.Cleanup(plain.Close)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/m.gguf", http.StatusFound)
	}))
	t.Cleanup(tlsSrv.Close)
	certFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", certFile)
	t.Setenv("SSL_CERT_DIR", t.TempDir())

	st := shippedStore(t, v1alpha1.SourcePolicySpec{
		Rules:           []v1alpha1.SourcePolicyRule{{Namespaces: []string{attackNS}, Hosts: []string{"127.0.0.1"}, AllowPlainHTTP: true}},
		AllowedNetworks: []string{"127.0.0.0/8"},
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// The https:// source itself is fetched: the certificate is trusted.
	_, err := st.Fetch(ctx, attackNS, tlsSrv.URL+"/m.gguf", "", nil)
	wantDeniedNaming(t, err, "from https:// to plain http://", "ask the source's owner to redirect to https://")
	var de *sourcepolicy.DeniedError
	if errors.As(err, &de) && de.Namespace != attackNS {
		t.Errorf("the denial names namespace %q, want %q", de.Namespace, attackNS)
	}
}

// TestAttackModelURLInRangesTheDenyListMissed: a tenant's source, on a host the
// SourcePolicy lists, is an address in a range the built-in denials once missed: the
// benchmarking 198.18/15 (lab gear), the reserved 240/4, and 6to4 and Teredo
// addresses, whose embedded IPv4 address (here a LAN one) a relay on the path
// connects to. On main the agent dialled each; its store, built as the command builds
// it, must refuse before it connects, naming the range and, for the tunnels, the
// embedded address.
func TestAttackModelURLInRangesTheDenyListMissed(t *testing.T) {
	for _, tc := range []struct {
		name, host string
		want       []string
	}{
		{"benchmarking", "198.18.0.1", []string{"198.18.0.1 is benchmarking (RFC 2544)", "add 198.18.0.1/32 to spec.allowedNetworks"}},
		{"reserved", "240.1.2.3", []string{"240.1.2.3 is reserved (240.0.0.0/4)", "spec.allowedNetworks"}},
		{"6to4", "2002:c0a8:101::1", []string{"2002:c0a8:101::1 is 6to4 (it embeds the IPv4 address 192.168.1.1)", "spec.allowedNetworks"}},
		{"Teredo", "2001:0:4136:e378:8000:63bf:f5ff:fffe", []string{"is Teredo (it embeds the IPv4 address 10.0.0.1)", "spec.allowedNetworks"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := shippedStore(t, v1alpha1.SourcePolicySpec{
				Rules: []v1alpha1.SourcePolicyRule{{Namespaces: []string{attackNS}, Hosts: []string{tc.host}, AllowPlainHTTP: true}},
			})
			// Without the denial the store would dial the address: the timeout keeps
			// that failure short.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			src := (&url.URL{Scheme: "http", Host: net.JoinHostPort(tc.host, "8080"), Path: "/m.gguf"}).String()
			_, err := st.Fetch(ctx, attackNS, src, "", nil)
			wantDeniedNaming(t, err, tc.want...)
		})
	}
}

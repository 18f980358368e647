package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/certsigner"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// testCA issues serving certificates for the loopback address, as an organisation's
// CA or a certificate issuer would.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue returns a PEM certificate for 127.0.0.1 and localhost with serial and
// lifetime, and its PEM key.
func (ca *testCA) issue(t *testing.T, serial int64, lifetime time.Duration) (certPEM, keyPEM []byte, notAfter time.Time) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	notAfter = time.Now().Add(lifetime).Truncate(time.Second)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "gateway"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), notAfter
}

// secretVolume lays files out as the kubelet mounts a Secret: the files are links
// through "..data" to a directory of the current version, and an update swaps
// "..data" to a new directory and removes the old one.
type secretVolume struct {
	dir     string
	version int
}

func (v *secretVolume) write(t *testing.T, files map[string][]byte) {
	t.Helper()
	v.version++
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	ts := fmt.Sprintf("..v%d", v.version)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(v.dir, ts, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(v.dir, name)); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// tlsClient trusts pool only and offers HTTP/2, which the gateway declines.
func tlsClient(pool *x509.CertPool) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true}}
}

// servedSerial is the serial number of the certificate addr serves.
func servedSerial(addr string, pool *x509.CertPool) (int64, error) {
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, ServerName: "127.0.0.1"})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

// TestThroughOwnTLS: the gateway serves HTTPS itself from a certificate mounted as
// a Secret's files. The official OpenAI client, trusting the issuing CA, gets a real
// completion from a runner through it; a plain-HTTP client is told it spoke HTTP to
// HTTPS; TLS below 1.2 is refused; a renewed certificate is served once its files
// change, and the expiry gauge follows.
func TestThroughOwnTLS(t *testing.T) {
	e, agent, keys := realAgent(t, "client-key")
	ca := newTestCA(t)
	vol := &secretVolume{dir: t.TempDir()}
	certPEM, keyPEM, notAfter := ca.issue(t, 100, 12*time.Hour)
	vol.write(t, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM})
	reg := prometheus.NewRegistry()
	g := startGateway(t, e, gateway.Config{APIKeysFile: keys, ColdStartTimeout: 30 * time.Second, Registerer: reg,
		TLSCertFile: filepath.Join(vol.dir, "tls.crt"), TLSKeyFile: filepath.Join(vol.dir, "tls.key")})
	addr := strings.TrimPrefix(g.url, "http://")
	base := "https://" + addr + "/v1/"

	tinyFleet(t, e, agent)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := tlsClient(ca.pool)
	oc := openai.NewClient(option.WithBaseURL(base), option.WithAPIKey("client-key"), option.WithMaxRetries(0), option.WithHTTPClient(hc))
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		page, err := oc.Models.List(ctx)
		if err != nil {
			return false, err.Error()
		}
		return len(page.Data) == 1 && page.Data[0].ID == "tiny", fmt.Sprintf("models %+v", page.Data)
	})

	t.Run("completion", func(t *testing.T) {
		var raw *http.Response
		resp, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "tiny", MaxTokens: openai.Int(4),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello there")}}, option.WithResponseInto(&raw))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" || resp.Usage.CompletionTokens != 4 {
			t.Errorf("response %+v", resp)
		}
		if raw.TLS == nil || raw.TLS.Version < tls.VersionTLS12 || raw.Proto != "HTTP/1.1" {
			t.Errorf("served over %s with TLS %+v, want HTTP/1.1 over TLS 1.2 or later", raw.Proto, raw.TLS)
		}
	})
	t.Run("plain HTTP", func(t *testing.T) {
		plain := openai.NewClient(option.WithBaseURL("http://"+addr+"/v1/"), option.WithAPIKey("client-key"), option.WithMaxRetries(0))
		_, err := plain.Models.List(ctx)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP to the TLS port: %v, want a 400", err)
		}
		resp, err := http.Get("http://" + addr + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTP request to an HTTPS server") {
			t.Errorf("plain HTTP answered %d %q, want 400 saying HTTPS is spoken here", resp.StatusCode, body)
		}
	})
	t.Run("TLS 1.1 refused", func(t *testing.T) {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}) //nolint:gosec // the attack
		if err == nil {
			c.Close()
			t.Fatal("a TLS 1.1 handshake succeeded")
		}
	})
	t.Run("untrusted", func(t *testing.T) {
		other := newTestCA(t)
		if _, err := servedSerial(addr, other.pool); err == nil {
			t.Fatal("a client trusting another CA accepted the gateway's certificate")
		}
	})
	t.Run("rotation", func(t *testing.T) {
		checkExpiry(t, reg, notAfter)
		certPEM, keyPEM, notAfter := ca.issue(t, 101, 48*time.Hour)
		vol.write(t, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM})
		testenv.Eventually(t, 3*gateway.DefaultTLSPoll, 50*time.Millisecond, func() (bool, string) {
			serial, err := servedSerial(addr, ca.pool)
			return err == nil && serial == 101, fmt.Sprintf("served serial %d (%v), want 101", serial, err)
		})
		checkExpiry(t, reg, notAfter)
		// New connections of the client get the renewed certificate and still work.
		hc.CloseIdleConnections()
		if _, err := oc.Models.List(ctx); err != nil {
			t.Errorf("after rotation: %v", err)
		}
	})
	// The manager's fleet CA as the issuer (chart gateway.tls.fromFleetCA): the
	// authority keeps the serving Secret, its files replace the mounted ones, and a
	// client trusting only that Secret's ca.crt gets a completion.
	t.Run("fleet CA", func(t *testing.T) {
		if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mfv1.SystemNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		a := &certsigner.Authority{Client: e.Client, GatewayServingSecret: "macfleet-gateway-https",
			GatewayServingHosts: []string{"127.0.0.1", "localhost"}, Log: logr.Discard()}
		if _, err := a.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		var sec corev1.Secret
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: mfv1.SystemNamespace, Name: "macfleet-gateway-https"}, &sec); err != nil {
			t.Fatal(err)
		}
		if sec.Type != corev1.SecretTypeTLS {
			t.Errorf("the serving Secret is of type %s", sec.Type)
		}
		vol.write(t, map[string][]byte{"tls.crt": sec.Data["tls.crt"], "tls.key": sec.Data["tls.key"]})
		fleet := x509.NewCertPool()
		if !fleet.AppendCertsFromPEM(sec.Data["ca.crt"]) {
			t.Fatalf("the serving Secret's ca.crt holds no certificate: %q", sec.Data["ca.crt"])
		}
		testenv.Eventually(t, 3*gateway.DefaultTLSPoll, 50*time.Millisecond, func() (bool, string) {
			_, err := servedSerial(addr, fleet)
			return err == nil, fmt.Sprintf("the fleet CA's certificate is not served yet: %v", err)
		})
		fc := openai.NewClient(option.WithBaseURL(base), option.WithAPIKey("client-key"), option.WithMaxRetries(0), option.WithHTTPClient(tlsClient(fleet)))
		resp, err := fc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "tiny", MaxTokens: openai.Int(4),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello there")}})
		if err != nil || len(resp.Choices) != 1 || resp.Usage.CompletionTokens != 4 {
			t.Fatalf("a completion through the fleet CA's certificate: %+v, %v", resp, err)
		}
		if _, err := servedSerial(addr, ca.pool); err == nil {
			t.Error("a client trusting only the former issuer still accepts the gateway")
		}
	})
}

// checkExpiry waits for the expiry gauge to read notAfter (the certificate watcher
// reports a new certificate in the background).
func checkExpiry(t *testing.T, reg *prometheus.Registry, notAfter time.Time) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		mfs, err := reg.Gather()
		if err != nil {
			return false, err.Error()
		}
		for _, mf := range mfs {
			if mf.GetName() == "macfleet_gateway_tls_certificate_expiry_timestamp_seconds" {
				got := mf.GetMetric()[0].GetGauge().GetValue()
				return got == float64(notAfter.Unix()), fmt.Sprintf("expiry gauge %v, want %d", got, notAfter.Unix())
			}
		}
		return false, "no expiry gauge"
	})
}

// TestTLSFilesRefused: the gateway does not start on TLS files it cannot serve with,
// and says which flag and what is wrong.
func TestTLSFilesRefused(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	certPEM, keyPEM, _ := ca.issue(t, 1, time.Hour)
	_, otherKey, _ := ca.issue(t, 2, time.Hour)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key, other, junk := write("tls.crt", certPEM), write("tls.key", keyPEM), write("other.key", otherKey), write("junk", []byte("not PEM"))
	missing := filepath.Join(dir, "missing.crt")
	for _, tc := range []struct {
		name, cert, key string
		want            []string
	}{
		{"cert without key", cert, "", []string{"--tls-key-file"}},
		{"key without cert", "", key, []string{"--tls-cert-file"}},
		{"missing cert", missing, key, []string{"--tls-cert-file " + missing, "no such file"}},
		{"not PEM", junk, key, []string{"--tls-cert-file " + junk, "PEM"}},
		{"key of another certificate", cert, other, []string{"--tls-key-file " + other, "private key does not match public key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			err = gateway.Run(t.Context(), gateway.Config{Listener: ln, TLSCertFile: tc.cert, TLSKeyFile: tc.key,
				Registerer: prometheus.NewRegistry(), ProbeAddr: "0", MetricsAddr: "0"})
			if err == nil {
				t.Fatal("the gateway ran")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

package testenv

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TokenReviews is how many TokenReviews the API server of cfg has answered, by its
// own count (apiserver_request_total of resource tokenreviews, every code).
func TokenReviews(tb testing.TB, cfg *rest.Config) int {
	tb.Helper()
	n, err := CountTokenReviews(tb.Context(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// CountTokenReviews is TokenReviews outside a test (a benchmark harness).
func CountTokenReviews(ctx context.Context, cfg *rest.Config) (int, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("the API server's /metrics: %d %s", resp.StatusCode, b)
	}
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "apiserver_request_total{") || !strings.Contains(l, `resource="tokenreviews"`) {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", l, err)
		}
		n += int(v)
	}
	return n, sc.Err()
}

// ServiceAccountToken creates ServiceAccount name in ns and returns a token of it for
// audience, and the issuer the API server signs its tokens as.
func ServiceAccountToken(tb testing.TB, cfg *rest.Config, ns, name, audience string) (token, issuer string) {
	tb.Helper()
	token, issuer, err := NewServiceAccountToken(tb.Context(), cfg, ns, name, audience)
	if err != nil {
		tb.Fatal(err)
	}
	return token, issuer
}

// NewServiceAccountToken is ServiceAccountToken outside a test (a benchmark harness).
func NewServiceAccountToken(ctx context.Context, cfg *rest.Config, ns, name, audience string) (token, issuer string, err error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", "", err
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}},
		metav1.CreateOptions{}); err != nil {
		return "", "", fmt.Errorf("creating ServiceAccount %s/%s: %w", ns, name, err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
	if err != nil {
		return "", "", fmt.Errorf("a token of ServiceAccount %s/%s: %w", ns, name, err)
	}
	var claims struct{ Iss string }
	parts := strings.Split(tr.Status.Token, ".")
	if len(parts) != 3 {
		return "", "", fmt.Errorf("the ServiceAccount token has %d parts", len(parts))
	}
	if b, err := base64.RawURLEncoding.DecodeString(parts[1]); err != nil || json.Unmarshal(b, &claims) != nil {
		return "", "", fmt.Errorf("the ServiceAccount token's claims: %v", err)
	}
	return tr.Status.Token, claims.Iss, nil
}

// ForgedToken is a JWT-shaped bearer whose claims pass every check but the
// signature: audience, an hour to live, issuer, and a random subject and signature.
func ForgedToken(audience, issuer string) string {
	enc := base64.RawURLEncoding.EncodeToString
	claims, _ := json.Marshal(map[string]any{"aud": []string{audience}, "exp": time.Now().Add(time.Hour).Unix(),
		"iss": issuer, "sub": "system:serviceaccount:team:" + rand.Text()})
	return enc([]byte(`{"alg":"RS256","kid":"forged"}`)) + "." + enc(claims) + "." + enc([]byte(rand.Text()+rand.Text()))
}

// RandomBearer is a bearer that looks like a JWT at a glance ("eyJ" and two dots) and
// is random bytes.
func RandomBearer() string {
	return "eyJ" + rand.Text() + "." + rand.Text() + "." + rand.Text()
}

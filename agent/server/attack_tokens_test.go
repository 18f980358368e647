package server_test

import (
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAttackRandomTokensFloodTheAgent: an agent's OpenAI API on the LAN, checking
// ServiceAccount tokens through a real API server as the cluster agent does, gets
// 300 forged JWT-shaped bearers from one address. Before, each was a TokenReview
// (refusals cached per token, never a hit). Now they are reviewed only within the
// source's limit, by the API server's own count, and answered 429
// token_review_limited with Retry-After past it; a valid ServiceAccount token from
// another address still authenticates.
func TestAttackRandomTokensFloodTheAgent(t *testing.T) {
	const n = 300
	e, err := testenv.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Error(err)
		}
	})
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := satoken.New(cs.AuthenticationV1().TokenReviews(), satoken.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, agentOptions{noRunner: true, apiKey: "fleet-k3y", reviewToken: rev.Review})
	ns := testenv.NewNamespace(t, e.Client)
	valid, issuer := testenv.ServiceAccountToken(t, e.Config, ns, "ci", satoken.DefaultAudience)

	before := testenv.TokenReviews(t, e.Config)
	start := time.Now()
	limited := 0
	for range n {
		resp := bearerGet(t, &http.Client{}, a.url+"/v1/models", testenv.ForgedToken(satoken.DefaultAudience, issuer))
		switch {
		case resp.StatusCode == http.StatusTooManyRequests && strings.Contains(resp.body, "token_review_limited") &&
			resp.Header.Get("Retry-After") != "":
			limited++
		case resp.StatusCode != http.StatusUnauthorized:
			t.Fatalf("a forged token: %d %s, want 401, or 429 token_review_limited with Retry-After", resp.StatusCode, resp.body)
		}
	}
	elapsed := time.Since(start)
	reviews := testenv.TokenReviews(t, e.Config) - before
	bound := satoken.DefaultReviewBurstPerSource + int(math.Ceil(satoken.DefaultReviewsPerSource*elapsed.Seconds()))
	t.Logf("%d forged bearers in %v: %d limited, %d TokenReviews (bound %d)", n, elapsed.Round(time.Millisecond), limited, reviews, bound)
	if reviews > bound {
		t.Errorf("%d TokenReviews for %d forged bearers from one address in %v, want at most %d", reviews, n, elapsed, bound)
	}

	other := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	if resp := bearerGet(t, other, a.url+"/v1/models", valid); resp.StatusCode != http.StatusOK {
		t.Errorf("a valid ServiceAccount token from another address after the flood: %d %s", resp.StatusCode, resp.body)
	}
}

type answer struct {
	*http.Response
	body string
}

func bearerGet(t *testing.T, c *http.Client, url, bearer string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{Response: resp, body: string(b)}
}

package gateway_test

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAttackRandomTokensFloodTokenReviews: one client at 127.0.0.1 sends 500
// JWT-shaped bearers to the gateway: 400 forged ones that only the signature betrays
// and 100 of random bytes. Before, each made the gateway create a TokenReview (500),
// and each refusal was cached under its own token, so none was ever a hit. Now the
// random ones are refused without a review (Fit), and the forged ones are reviewed
// only within the source's limit (a burst of 20, then 5 a second): the API server,
// by its own count, answers at most that many TokenReviews, the others are answered
// 429 token_review_limited; and a valid ServiceAccount token from 127.0.0.2 still
// authenticates, at once.
func TestAttackRandomTokensFloodTokenReviews(t *testing.T) {
	const forgedN, randomN, workers = 400, 100, 20
	e := cluster(t)
	g := startGateway(t, e, gateway.Config{TenantKeys: true, GatewayID: "gw-tokens"})
	ns := testenv.NewNamespace(t, e.Client)
	valid, issuer := testenv.ServiceAccountToken(t, e.Config, ns, "ci", satoken.DefaultAudience)

	tokens := make(chan string, forgedN+randomN)
	for i := range forgedN + randomN {
		if i%5 == 4 {
			tokens <- testenv.RandomBearer()
		} else {
			tokens <- testenv.ForgedToken(satoken.DefaultAudience, issuer)
		}
	}
	close(tokens)
	before := testenv.TokenReviews(t, e.Config)
	attacker := from("127.0.0.1")
	var (
		mu     sync.Mutex
		status = map[int]int{}
		wg     sync.WaitGroup
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for tok := range tokens {
				code, body := sendWith(attacker, g.url+"/v1/models", tok)
				mu.Lock()
				status[code]++
				mu.Unlock()
				if code != http.StatusUnauthorized && !(code == http.StatusTooManyRequests && strings.Contains(body, "token_review_limited")) {
					t.Errorf("a forged token: %d %s, want 401 or 429 token_review_limited", code, body)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	reviews := testenv.TokenReviews(t, e.Config) - before
	bound := satoken.DefaultReviewBurstPerSource + int(math.Ceil(satoken.DefaultReviewsPerSource*elapsed.Seconds()))
	t.Logf("%d random bearers in %v: answers %v, %d TokenReviews (bound %d)", forgedN+randomN, elapsed.Round(time.Millisecond),
		status, reviews, bound)
	if reviews > bound {
		t.Errorf("%d TokenReviews for %d random bearers from one source in %v, want at most %d", reviews, forgedN+randomN, elapsed, bound)
	}

	code, body := sendWith(from("127.0.0.2"), g.url+"/v1/models", valid)
	if code != http.StatusOK {
		t.Errorf("a valid ServiceAccount token from another address after the flood: %d %s, want 200", code, body)
	}
}

// sendWith GETs url with bearer through c.
func sendWith(c *http.Client, url, bearer string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAttackForeignAndExpiredTokensReachTokenReview: one client sends 1,000
// JWT-shaped bearers for the fleet's audience, half naming another issuer (minted by
// any cluster or by the attacker), half of this cluster's issuer but expired. Before,
// the issuer was not read, so each foreign token cost a TokenReview until the
// source's limit (a burst of 20, then 5 a second). Now the gateway learns the
// cluster's issuer from the API server's discovery document and refuses both kinds
// without a review: the API server, by its own count, answers none. A valid
// ServiceAccount token still authenticates.
func TestAttackForeignAndExpiredTokensReachTokenReview(t *testing.T) {
	const n, workers = 1000, 20
	e := cluster(t)
	g := startGateway(t, e, gateway.Config{TenantKeys: true, GatewayID: "gw-issuer"})
	ns := testenv.NewNamespace(t, e.Client)
	valid, issuer := testenv.ServiceAccountToken(t, e.Config, ns, "ci", satoken.DefaultAudience)

	tokens := make(chan string, n)
	for i := range n {
		if i%2 == 0 {
			tokens <- testenv.ForgedToken(satoken.DefaultAudience, "https://attacker.example")
		} else {
			tokens <- expiredToken(satoken.DefaultAudience, issuer)
		}
	}
	close(tokens)
	before := testenv.TokenReviews(t, e.Config)
	attacker := from("127.0.0.1")
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for tok := range tokens {
				if code, body := sendWith(attacker, g.url+"/v1/models", tok); code != http.StatusUnauthorized {
					t.Errorf("a foreign or expired token: %d %s, want 401", code, body)
				}
			}
		})
	}
	wg.Wait()
	if reviews := testenv.TokenReviews(t, e.Config) - before; reviews != 0 {
		t.Errorf("%d bearers of another issuer or expired made %d TokenReviews, want none", n, reviews)
	}
	if code, body := sendWith(attacker, g.url+"/v1/models", valid); code != http.StatusOK {
		t.Errorf("a valid ServiceAccount token after the flood: %d %s, want 200", code, body)
	}
}

// expiredToken is a JWT for audience of issuer that expired a minute ago.
func expiredToken(audience, issuer string) string {
	enc := base64.RawURLEncoding.EncodeToString
	claims, _ := json.Marshal(map[string]any{"aud": []string{audience}, "exp": time.Now().Add(-time.Minute).Unix(),
		"iss": issuer, "sub": "system:serviceaccount:team:" + rand.Text()})
	return enc([]byte(`{"alg":"RS256","kid":"old"}`)) + "." + enc(claims) + "." + enc([]byte(rand.Text()))
}

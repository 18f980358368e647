package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// bearerResult is one flood of bearers from one source: the answers by status, the
// TokenReviews the API server answered meanwhile and what the per-source limit
// allows over the flood's time.
type bearerResult struct {
	Kind             string
	Sent             int
	Elapsed          time.Duration
	Status           map[int]int
	Reviews, Allowed int
	Unexpected       string
}

// bearerPhase floods the first gateway's /v1/models from 127.0.0.3 with o.bearers
// bearers of random bytes, then as many forged ones (claims that pass every check but
// the signature), counting the TokenReviews of each; then sends a valid
// ServiceAccount token from 127.0.0.4, whose answer's status it returns.
func bearerPhase(ctx context.Context, o options, fl *benchFleet) (random, forged bearerResult, valid int, err error) {
	token, issuer, err := testenv.NewServiceAccountToken(ctx, fl.f.Env.Config, namespace, "abuse-check", satoken.DefaultAudience)
	if err != nil {
		return random, forged, 0, err
	}
	attacker := from("127.0.0.3", true, o.bearerWorkers)
	if random, err = flood(ctx, o, fl, attacker, "random bytes", testenv.RandomBearer); err != nil {
		return random, forged, 0, err
	}
	if forged, err = flood(ctx, o, fl, attacker, "forged", func() string {
		return testenv.ForgedToken(satoken.DefaultAudience, issuer)
	}); err != nil {
		return random, forged, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fl.urls[0]+"/v1/models", nil)
	if err != nil {
		return random, forged, 0, err
	}
	valid, body, err := do(from("127.0.0.4", false, 1), req, token)
	if err != nil || valid != http.StatusOK {
		fmt.Fprintf(o.out, "bearers: a valid ServiceAccount token from another address after the floods: %d %s %v\n", valid, body, err)
	}
	return random, forged, valid, nil
}

// flood sends o.bearers bearers of next from c with o.bearerWorkers senders.
func flood(ctx context.Context, o options, fl *benchFleet, c *http.Client, kind string, next func() string) (bearerResult, error) {
	r := bearerResult{Kind: kind, Sent: o.bearers, Status: map[int]int{}}
	fmt.Fprintf(o.out, "bearers: %d %s from one source; load %s\n", o.bearers, kind, localfleet.LoadAverage())
	tokens := make(chan string, o.bearers)
	for range o.bearers {
		tokens <- next()
	}
	close(tokens)
	before, err := testenv.CountTokenReviews(ctx, fl.f.Env.Config)
	if err != nil {
		return r, err
	}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	start := time.Now()
	for range o.bearerWorkers {
		wg.Go(func() {
			for tok := range tokens {
				code, body := models(ctx, c, fl.urls[0], tok)
				mu.Lock()
				r.Status[code]++
				if code != http.StatusUnauthorized && (code != http.StatusTooManyRequests || !strings.Contains(body, "token_review_limited")) {
					r.Unexpected = fmt.Sprintf("%d %s", code, body)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r.Elapsed = time.Since(start)
	after, err := testenv.CountTokenReviews(ctx, fl.f.Env.Config)
	if err != nil {
		return r, err
	}
	r.Reviews = after - before
	r.Allowed = allowance(r.Elapsed)
	fmt.Fprintf(o.out, "bearers: %d %s in %v: answers %s, %d TokenReviews (the limit allows %d)\n",
		o.bearers, kind, r.Elapsed.Round(time.Millisecond), statusList(r.Status), r.Reviews, r.Allowed)
	return r, nil
}

// allowance is how many reviews the per-source limit allows one source over d: its
// burst, then its rate.
func allowance(d time.Duration) int {
	return satoken.DefaultReviewBurstPerSource + int(math.Ceil(satoken.DefaultReviewsPerSource*d.Seconds()))
}

// models GETs /v1/models with bearer; a transport error is status 0 with its text.
func models(ctx context.Context, c *http.Client, base, bearer string) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return 0, err.Error()
	}
	code, body, err := do(c, req, bearer)
	if err != nil {
		return 0, err.Error()
	}
	return code, body
}

// statusList is status counts as "401×9800 429×200", by status.
func statusList(m map[int]int) string {
	codes := make([]int, 0, len(m))
	for c := range m {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	parts := make([]string, len(codes))
	for i, c := range codes {
		parts[i] = fmt.Sprintf("%d×%d", c, m[c])
	}
	return strings.Join(parts, " ")
}

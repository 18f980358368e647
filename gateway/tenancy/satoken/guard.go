package satoken

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// A credential shaped like a token costs whoever presents it nothing and costs the
// API server a TokenReview. So a Reviewer asks only for tokens that could pass one
// (Fit), one review at a time per token (a singleflight), and limits the reviews of
// tokens it has no fresh answer for, per source address, per claimed namespace (the
// namespace the token's unverified claims name: ClaimedNamespace) and in all (a
// token bucket each): past the limit a token is answered LimitedError (a 429 to
// retry), not reviewed — unless it was accepted before and has not expired: then the
// earlier answer stands until a review is allowed again. Forged tokens that claim one
// namespace thus cost the API server that namespace's rate, never every
// namespace's, and a caller that worked keeps working through any flood. Accepted
// tokens and refused ones are cached apart, each bounded, so a flood of refusals
// never pushes out the answers of the callers that work.

// Defaults of the review limits of Options.
const (
	// DefaultReviewsPerSource and DefaultReviewBurstPerSource bound the reviews of
	// unknown tokens one source address (an IPv6 /64) causes: a burst, then a rate.
	DefaultReviewsPerSource     = 5
	DefaultReviewBurstPerSource = 20
	// DefaultReviewsPerNamespace and DefaultReviewBurstPerNamespace bound the reviews
	// of unknown tokens that claim one namespace, from every source.
	DefaultReviewsPerNamespace     = 10
	DefaultReviewBurstPerNamespace = 50
	// DefaultReviews and DefaultReviewBurst bound them over every source.
	DefaultReviews     = 50
	DefaultReviewBurst = 100
	// DefaultMaxRefused bounds the cache of refused tokens, apart from accepted ones.
	DefaultMaxRefused = 1024
	// maxSources bounds the per-source buckets, and those per namespace; past it they
	// start afresh.
	maxSources = 4096
)

// LimitedError is a token that was not reviewed because its source, or every source
// together, presented more unknown tokens than the reviews allow: retry after
// RetryAfter.
type LimitedError struct {
	RetryAfter time.Duration
	// Source: the source's own limit was reached, not the one of every source.
	Source bool
	// Namespace, when not empty: the limit of the tokens claiming that namespace was
	// reached.
	Namespace string
}

func (e *LimitedError) Error() string {
	who := "from every address"
	switch {
	case e.Source:
		who = "from your address"
	case e.Namespace != "":
		who = fmt.Sprintf("claiming namespace %q", e.Namespace)
	}
	return fmt.Sprintf("too many unknown ServiceAccount tokens %s to review now; retry in %v", who, e.RetryAfter)
}

type sourceKey struct{}

// WithSource is ctx naming the source address of the request whose token is
// reviewed (httpserver.SourceOf): its reviews count against that source's limit.
func WithSource(ctx context.Context, source string) context.Context {
	return context.WithValue(ctx, sourceKey{}, source)
}

func sourceOf(ctx context.Context) string {
	s, _ := ctx.Value(sourceKey{}).(string)
	return s
}

// Fit is why token cannot pass a TokenReview for audience at now, "" when it may: it
// must be a JWT whose header and claims are JSON, whose "exp" is after now, whose
// "aud" names audience and, when issuer is not empty, whose "iss" is issuer (this
// cluster's). The signature is not checked (the review does): Fit only spares the API
// server the tokens it would refuse anyway.
func Fit(token, audience, issuer string, now time.Time) string {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "not a JWT"
	}
	var header struct {
		Alg string `json:"alg"`
	}
	if b, err := base64.RawURLEncoding.DecodeString(parts[0]); err != nil || json.Unmarshal(b, &header) != nil || header.Alg == "" {
		return "not a JWT: its header is not JSON naming an algorithm"
	}
	var claims struct {
		Exp *float64        `json:"exp"`
		Aud json.RawMessage `json:"aud"`
		Iss string          `json:"iss"`
	}
	if b, err := base64.RawURLEncoding.DecodeString(parts[1]); err != nil || json.Unmarshal(b, &claims) != nil {
		return "not a JWT: its claims are not JSON"
	}
	switch {
	case claims.Exp == nil:
		return "the token has no expiry: project a bound ServiceAccount token"
	case *claims.Exp <= float64(now.Unix()):
		return "the token has expired"
	case !audiences(claims.Aud, audience):
		return fmt.Sprintf("the token is not for audience %q", audience)
	case issuer != "" && claims.Iss != issuer:
		return fmt.Sprintf("the token is not of this cluster's issuer %q", issuer)
	}
	return ""
}

// audiences reports whether a JWT's "aud" (a string or a list) names audience.
func audiences(raw json.RawMessage, audience string) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == audience
	}
	var list []string
	return json.Unmarshal(raw, &list) == nil && slices.Contains(list, audience)
}

// ClaimedNamespace is the namespace token's claims name, unverified: the
// "kubernetes.io" claim's namespace, else the one of a "sub" of
// "system:serviceaccount:NAMESPACE:NAME"; "" when neither does. A forger may claim
// any namespace; the claim only decides whose review bucket the token draws on.
func ClaimedNamespace(token string) string {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return ""
	}
	var claims struct {
		Sub string `json:"sub"`
		K8s struct {
			Namespace string `json:"namespace"`
		} `json:"kubernetes.io"`
	}
	if b, err := base64.RawURLEncoding.DecodeString(parts[1]); err != nil || json.Unmarshal(b, &claims) != nil {
		return ""
	}
	if claims.K8s.Namespace != "" {
		return claims.K8s.Namespace
	}
	rest, _ := strings.CutPrefix(claims.Sub, NamePrefix)
	ns, _, ok := strings.Cut(rest, ":")
	if !ok || rest == claims.Sub {
		return ""
	}
	return ns
}

// limiter is the token buckets of the reviews of unknown tokens: one per source, one
// per claimed namespace and one for all.
type limiter struct {
	perSource, perNamespace rate.Limit
	sourceBurst, nsBurst    int
	mu                      sync.Mutex
	all                     *rate.Limiter
	sources, namespaces     map[string]*rate.Limiter
	maxSourceLen            int
}

func newLimiter(o Options) *limiter {
	return &limiter{perSource: rate.Limit(o.ReviewsPerSource), sourceBurst: o.ReviewBurstPerSource,
		perNamespace: rate.Limit(o.ReviewsPerNamespace), nsBurst: o.ReviewBurstPerNamespace,
		all: rate.NewLimiter(rate.Limit(o.Reviews), o.ReviewBurst), sources: map[string]*rate.Limiter{},
		namespaces: map[string]*rate.Limiter{}, maxSourceLen: maxSources}
}

// bucket is m's bucket of key, created full (m afresh when it holds max of them).
func bucket(m map[string]*rate.Limiter, key string, r rate.Limit, burst, max int) *rate.Limiter {
	b := m[key]
	if b == nil {
		if len(m) >= max {
			clear(m)
		}
		b = rate.NewLimiter(r, burst)
		m[key] = b
	}
	return b
}

// allow takes one review from source's bucket, from namespace's and from the bucket
// of all at now, or says how long to wait when any is empty (taking nothing).
func (l *limiter) allow(source, namespace string, now time.Time) *LimitedError {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := bucket(l.sources, source, l.perSource, l.sourceBurst, l.maxSourceLen)
	n := bucket(l.namespaces, namespace, l.perNamespace, l.nsBurst, l.maxSourceLen)
	switch {
	case s.TokensAt(now) < 1:
		return &LimitedError{RetryAfter: wait(s, now), Source: true}
	case n.TokensAt(now) < 1:
		return &LimitedError{RetryAfter: wait(n, now), Namespace: namespace}
	case l.all.TokensAt(now) < 1:
		return &LimitedError{RetryAfter: wait(l.all, now)}
	}
	s.AllowN(now, 1)
	n.AllowN(now, 1)
	l.all.AllowN(now, 1)
	return nil
}

// wait is the whole seconds until b holds a token again, at least one.
func wait(b *rate.Limiter, now time.Time) time.Duration {
	if b.Limit() <= 0 {
		return time.Minute
	}
	missing := 1 - b.TokensAt(now)
	return max(time.Duration(math.Ceil(missing/float64(b.Limit())))*time.Second, time.Second)
}

// Package satoken authenticates in-cluster callers by their ServiceAccount tokens: a
// workload mounts a projected token whose audience is the fleet's (DefaultAudience)
// and sends it as "Authorization: Bearer TOKEN" to the gateway or to a deployment's
// own Service. The API server checks the token (a TokenReview naming the audience);
// the caller is then the tenant identity of its ServiceAccount:
//
//	tenancy.Identity{Namespace: <the ServiceAccount's namespace>, Name: "system:serviceaccount:<its name>"}
//
// which reaches what its namespace may use (tenancy.MayUse), like a key of that
// namespace. That Name is what TokenBudget.spec.key and the usage counters name the
// caller by.
//
// A Reviewer caches each review's answer under the token's SHA-256 (the tokens
// themselves are never kept): reused without asking for a short time (Options.TTL,
// never past the token's own expiry), so a busy caller costs one TokenReview per TTL.
// An accepted answer is kept to the token's expiry ("exp"): past the TTL the token is
// reviewed again when the review limits allow, and answered from the kept answer when
// they do not, so a flood of forged tokens never turns away a caller that worked. A
// deleted ServiceAccount, or one re-created under the same name, stops its tokens
// within the TTL unless the reviews are limited then, and at the token's expiry at
// the latest (an hour for a projected token). Tokens are never logged. It reviews
// only tokens that could pass (Fit), once at a time per token, and limits the reviews
// per source, per claimed namespace and in all (guard.go).
//
// The decisions are pure: Identify reads a review's status, LooksLikeToken tells a
// token from an API key, and the cache takes its clock from the caller.
package satoken

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/macfleet/macfleet/gateway/tenancy"
)

// Defaults of Options.
const (
	// DefaultAudience is the audience a token must be minted for to call the fleet.
	DefaultAudience = "macfleet"
	// DefaultTTL is how long a review's answer is reused without asking again: the
	// longest a deleted ServiceAccount's token keeps working while reviews are not
	// limited.
	DefaultTTL = 10 * time.Second
	// DefaultMaxEntries bounds the cache of accepted tokens; a full cache drops its
	// expired entries, then arbitrary ones. Refused tokens have their own
	// (DefaultMaxRefused).
	DefaultMaxEntries = 4096
	// DefaultTimeout bounds one TokenReview.
	DefaultTimeout = 5 * time.Second
)

// NamePrefix starts the Name of a ServiceAccount's identity; the ServiceAccount's name
// follows.
const NamePrefix = "system:serviceaccount:"

// Reviews creates TokenReviews: the client-go TokenReviewInterface
// (clientset.AuthenticationV1().TokenReviews()) is one.
type Reviews interface {
	Create(ctx context.Context, tr *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error)
}

// Options configure a Reviewer; zero fields take the defaults.
type Options struct {
	Audience string
	// Issuer, when set, is the only "iss" a token reviewed may name: this cluster's
	// (Issuer, DiscoverIssuer). Tokens of another issuer are refused without a review.
	Issuer     string
	TTL        time.Duration
	MaxEntries int
	MaxRefused int
	Timeout    time.Duration
	Clock      clock.PassiveClock
	// ReviewsPerSource a second, after a burst of ReviewBurstPerSource, are the
	// reviews of unknown tokens one source address may cause; ReviewsPerNamespace and
	// ReviewBurstPerNamespace those of tokens claiming one namespace; Reviews and
	// ReviewBurst those of every source together.
	ReviewsPerSource        float64
	ReviewBurstPerSource    int
	ReviewsPerNamespace     float64
	ReviewBurstPerNamespace int
	Reviews                 float64
	ReviewBurst             int
	// Registerer, when set, receives macfleet_<Component>_token_reviews_total{result}:
	// how tokens were answered, ResultCached (from the cache, either way),
	// ResultAccepted and ResultRefused (by a review), ResultFailed (the review
	// failed), ResultUnfit (refused without a review: Fit), ResultLimited (not
	// reviewed: over the limit) or ResultKept (over the limit, answered from an
	// earlier acceptance the token's expiry has not ended).
	Registerer prometheus.Registerer
	Component  string
}

// The result label of the reviews counter.
const (
	ResultCached   = "cached"
	ResultAccepted = "accepted"
	ResultRefused  = "refused"
	ResultFailed   = "failed"
	ResultUnfit    = "unfit"
	ResultLimited  = "limited"
	ResultKept     = "kept"
)

// Reviewer authenticates ServiceAccount tokens through the API server, with a cache.
type Reviewer struct {
	reviews Reviews
	opts    Options
	// counted is the reviews counter by result (nil: not counted).
	counted *prometheus.CounterVec

	limits  *limiter
	flights singleflight.Group

	mu sync.RWMutex
	// entries are the accepted tokens' answers, refused the refused ones'.
	entries, refused map[[32]byte]entry
}

// entry is a cached answer: the identity, or why the token was refused; reused
// without a review until fresh, kept until expires.
type entry struct {
	id             tenancy.Identity
	refusal        string
	fresh, expires time.Time
}

// New is a Reviewer asking reviews. It fails only when its counter cannot be
// registered.
func New(reviews Reviews, opts Options) (*Reviewer, error) {
	if opts.Audience == "" {
		opts.Audience = DefaultAudience
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.MaxRefused <= 0 {
		opts.MaxRefused = DefaultMaxRefused
	}
	def := func(v *float64, b *int, dv float64, db int) {
		if *v <= 0 {
			*v = dv
		}
		if *b <= 0 {
			*b = db
		}
	}
	def(&opts.ReviewsPerSource, &opts.ReviewBurstPerSource, DefaultReviewsPerSource, DefaultReviewBurstPerSource)
	def(&opts.ReviewsPerNamespace, &opts.ReviewBurstPerNamespace, DefaultReviewsPerNamespace, DefaultReviewBurstPerNamespace)
	def(&opts.Reviews, &opts.ReviewBurst, DefaultReviews, DefaultReviewBurst)
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	r := &Reviewer{reviews: reviews, opts: opts, limits: newLimiter(opts), entries: map[[32]byte]entry{}, refused: map[[32]byte]entry{}}
	if opts.Registerer != nil {
		r.counted = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_" + opts.Component + "_token_reviews_total",
			Help: "ServiceAccount tokens presented, by how they were answered: cached, accepted or refused by a TokenReview, failed " +
				"(the review failed), unfit (refused without a review: not a JWT, expired, or of another audience or issuer) or " +
				"limited (not reviewed: too many unknown tokens from the source, claiming the namespace, or in all; answered 429) or " +
				"kept (over those limits, answered from an earlier acceptance before the token's expiry).",
		}, []string{"result"})
		if err := opts.Registerer.Register(r.counted); err != nil {
			// A second reviewer of the process (gateways in one test) shares the counter.
			are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err)
			existing, same := are.ExistingCollector.(*prometheus.CounterVec)
			if !ok || !same {
				return nil, fmt.Errorf("registering the token reviews counter: %w", err)
			}
			r.counted = existing
		}
	}
	return r, nil
}

func (r *Reviewer) count(result string) {
	if r.counted != nil {
		r.counted.WithLabelValues(result).Inc()
	}
}

// Audience is the audience tokens must carry.
func (r *Reviewer) Audience() string { return r.opts.Audience }

// RefusedError is a token the API server did not accept for this fleet (invalid,
// expired, of a deleted ServiceAccount, of another audience, or not a
// ServiceAccount's). Its message never holds the token.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "the ServiceAccount token was refused: " + e.Reason }

// Review is the identity of token: a *RefusedError when the API server does not
// accept it, or would not (Fit); a *LimitedError when it was not reviewed, over the
// limit of reviews of ctx's source (WithSource), of its claimed namespace or of all,
// and not accepted before; another error when it could not be asked (not cached: the
// next request asks again). Concurrent reviews of one token share one TokenReview.
func (r *Reviewer) Review(ctx context.Context, token string) (tenancy.Identity, error) {
	h := sha256.Sum256([]byte(token))
	now := r.opts.Clock.Now()
	if e, ok := r.cached(h, now); ok {
		r.count(ResultCached)
		return e.answer()
	}
	if why := Fit(token, r.opts.Audience, r.opts.Issuer, now); why != "" {
		r.count(ResultUnfit)
		return tenancy.Identity{}, &RefusedError{Reason: why}
	}
	source, ns := sourceOf(ctx), ClaimedNamespace(token)
	v, err, _ := r.flights.Do(string(h[:]), func() (any, error) {
		now := r.opts.Clock.Now()
		if e, ok := r.cached(h, now); ok { // answered while this one waited
			return e, nil
		}
		if lim := r.limits.allow(source, ns, now); lim != nil {
			if e, ok := r.kept(h, now); ok {
				r.count(ResultKept)
				return e, nil
			}
			return nil, lim
		}
		return r.review(context.WithoutCancel(ctx), h, token)
	})
	var lim *LimitedError
	switch {
	case errors.As(err, &lim):
		r.count(ResultLimited)
		return tenancy.Identity{}, err
	case err != nil:
		return tenancy.Identity{}, err
	}
	return v.(entry).answer()
}

// review asks the API server about token, caches and counts the answer.
func (r *Reviewer) review(ctx context.Context, h [32]byte, token string) (entry, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	tr, err := r.reviews.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token,
		Audiences: []string{r.opts.Audience}}}, metav1.CreateOptions{})
	if err != nil {
		r.count(ResultFailed)
		return entry{}, fmt.Errorf("reviewing a ServiceAccount token: %w", err)
	}
	now := r.opts.Clock.Now()
	e := entry{fresh: Expiry(token, now, r.opts.TTL)}
	e.expires = e.fresh
	if e.id, err = Identify(tr.Status, r.opts.Audience); err != nil {
		e.refusal = err.Error()
		r.count(ResultRefused)
		r.mu.Lock()
		delete(r.entries, h) // an acceptance kept past its TTL is withdrawn
		r.mu.Unlock()
		r.store(r.refused, r.opts.MaxRefused, h, e, now)
	} else {
		r.count(ResultAccepted)
		e.expires = Expiry(token, now, maxKeep)
		r.store(r.entries, r.opts.MaxEntries, h, e, now)
	}
	return e, nil
}

// maxKeep bounds how long an accepted answer is kept when the token's expiry is
// further away (a legacy token's is unbounded; a projected one's is an hour or
// more).
const maxKeep = 24 * time.Hour

// cached is the fresh answer for h, if any.
func (r *Reviewer) cached(h [32]byte, now time.Time) (entry, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.entries[h]
	if !ok {
		e, ok = r.refused[h]
	}
	return e, ok && now.Before(e.fresh)
}

// kept is the accepted answer for h that its token's expiry has not ended, if any.
func (r *Reviewer) kept(h [32]byte, now time.Time) (entry, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.entries[h]
	return e, ok && now.Before(e.expires)
}

func (e entry) answer() (tenancy.Identity, error) {
	if e.refusal != "" {
		return tenancy.Identity{}, &RefusedError{Reason: e.refusal}
	}
	return e.id, nil
}

// store caches e in m of at most limit answers, making room first when it is full.
func (r *Reviewer) store(m map[[32]byte]entry, limit int, h [32]byte, e entry, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := m[h]; !ok && len(m) >= limit {
		for k, old := range m {
			if !now.Before(old.expires) {
				delete(m, k)
			}
		}
		for k := range m {
			if len(m) < limit {
				break
			}
			delete(m, k)
		}
	}
	m[h] = e
}

// Len is how many answers the caches hold, accepted and refused.
func (r *Reviewer) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.entries) + len(r.refused)
}

// Identify is the tenant identity a TokenReview's status authenticates for audience:
// the ServiceAccount's namespace and "system:serviceaccount:<name>". A token that is
// not authenticated, not for audience, or not a ServiceAccount's is an error saying
// why.
func Identify(st authnv1.TokenReviewStatus, audience string) (tenancy.Identity, error) {
	if !st.Authenticated {
		if st.Error != "" {
			return tenancy.Identity{}, errors.New("not authenticated: " + st.Error)
		}
		return tenancy.Identity{}, errors.New("not authenticated (expired, of a deleted ServiceAccount, or not for audience " + audience + ")")
	}
	// The API server answers with the audiences of the request the token is valid for;
	// an empty list would mean it ignored the request's audiences.
	if !slices.Contains(st.Audiences, audience) {
		return tenancy.Identity{}, fmt.Errorf("the token is not for audience %q", audience)
	}
	rest, ok := strings.CutPrefix(st.User.Username, NamePrefix)
	ns, name, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || ns == "" || name == "" || strings.Contains(name, ":") {
		return tenancy.Identity{}, fmt.Errorf("%q is not a ServiceAccount", st.User.Username)
	}
	return tenancy.Identity{Namespace: ns, Name: NamePrefix + name}, nil
}

// LooksLikeToken says whether a bearer credential is shaped like a ServiceAccount
// token (a JWT: three base64url parts, a JSON header first), so that only those are
// sent to the API server: the teams' API keys never are.
func LooksLikeToken(s string) bool {
	if !strings.HasPrefix(s, "eyJ") || strings.Count(s, ".") != 2 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// Expiry is when a review of token answered at now stops being reused: after ttl, or
// at the token's own expiry ("exp", read without checking the signature, which only
// shortens the reuse) if that is sooner.
func Expiry(token string, now time.Time, ttl time.Duration) time.Time {
	end := now.Add(ttl)
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return end
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return end
	}
	var claims struct {
		Exp *int64 `json:"exp"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp == nil {
		return end
	}
	if exp := time.Unix(*claims.Exp, 0); exp.Before(end) {
		return exp
	}
	return end
}

package satoken

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/test/support/testenv"
)

func TestFit(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	exp := now.Unix() + 60
	for _, tc := range []struct {
		name, token, issuer, want string
	}{
		{"a bound token", jwt(fmt.Sprintf(`{"aud":["macfleet"],"exp":%d,"iss":"https://k8s"}`, exp)), "", ""},
		{"aud as a string", jwt(fmt.Sprintf(`{"aud":"macfleet","exp":%d}`, exp)), "", ""},
		{"of this cluster's issuer", jwt(fmt.Sprintf(`{"aud":["macfleet"],"exp":%d,"iss":"https://k8s"}`, exp)), "https://k8s", ""},
		{"of another issuer", jwt(fmt.Sprintf(`{"aud":["macfleet"],"exp":%d,"iss":"https://elsewhere"}`, exp)), "https://k8s",
			`not of this cluster's issuer "https://k8s"`},
		{"no issuer where one is known", jwt(fmt.Sprintf(`{"aud":["macfleet"],"exp":%d}`, exp)), "https://k8s", "not of this cluster's issuer"},
		{"of any issuer", jwt(fmt.Sprintf(`{"aud":["x","macfleet"],"exp":%d,"iss":"any"}`, exp)), "", ""},
		{"two parts", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0", "", "not a JWT"},
		{"random bytes", "eyJabc.def.ghi", "", "not a JWT: its header"},
		{"a header without alg", "eyJ9.e30.c2ln", "", "not a JWT: its header"},
		{"claims not JSON", jwt("not json"), "", "not a JWT: its claims"},
		{"no exp (a legacy token)", jwt(`{"aud":["macfleet"]}`), "", "no expiry"},
		{"expired", jwt(fmt.Sprintf(`{"aud":["macfleet"],"exp":%d}`, now.Unix())), "", "expired"},
		{"another audience", jwt(fmt.Sprintf(`{"aud":["https://kubernetes.default.svc"],"exp":%d}`, exp)), "", `not for audience "macfleet"`},
		{"no audience", jwt(fmt.Sprintf(`{"exp":%d}`, exp)), "", `not for audience "macfleet"`},
	} {
		if got := Fit(tc.token, "macfleet", tc.issuer, now); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: Fit = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestLimiter: a source's burst, then its rate; another source has its own; a
// claimed namespace's bucket bounds every source's tokens claiming it, and another
// namespace has its own; the bucket of all bounds them together; a refusal says how
// long to wait.
func TestLimiter(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l := newLimiter(Options{ReviewsPerSource: 1, ReviewBurstPerSource: 2, ReviewsPerNamespace: 1, ReviewBurstPerNamespace: 3,
		Reviews: 1, ReviewBurst: 5})
	steps := []struct {
		src, ns string
		at      time.Duration
		want    string // "" allowed, "source", "namespace" or "all"
	}{
		{"a", "x", 0, ""}, {"a", "x", 0, ""}, {"a", "x", 0, "source"}, {"b", "x", 0, ""}, {"c", "x", 0, "namespace"},
		{"c", "y", 0, ""}, {"d", "z", 0, ""}, {"e", "w", 0, "all"},
		{"a", "y", time.Second, ""}, {"c", "w", 1100 * time.Millisecond, "all"}, {"c", "w", 2100 * time.Millisecond, ""},
	}
	for i, s := range steps {
		lim := l.allow(s.src, s.ns, now.Add(s.at))
		got := ""
		switch {
		case lim != nil && lim.Source:
			got = "source"
		case lim != nil && lim.Namespace != "":
			got = "namespace"
		case lim != nil:
			got = "all"
		}
		if got != s.want {
			t.Fatalf("step %d (%s claiming %s at %v): %q, want %q", i, s.src, s.ns, s.at, got, s.want)
		}
		if lim != nil && lim.RetryAfter < time.Second {
			t.Errorf("step %d: Retry-After %v, want at least a second", i, lim.RetryAfter)
		}
	}
}

func TestClaimedNamespace(t *testing.T) {
	for _, tc := range []struct{ name, token, want string }{
		{"the kubernetes.io claim", jwt(`{"sub":"system:serviceaccount:a:ci","kubernetes.io":{"namespace":"b"}}`), "b"},
		{"the subject", jwt(`{"sub":"system:serviceaccount:team-a:ci"}`), "team-a"},
		{"a user, not a ServiceAccount", jwt(`{"sub":"alice"}`), ""},
		{"a subject without a name", jwt(`{"sub":"system:serviceaccount:team-a"}`), ""},
		{"no claims", "eyJhbGciOiJSUzI1NiJ9.bm90IGpzb24.c2ln", ""},
		{"not a JWT", "abc", ""},
	} {
		if got := ClaimedNamespace(tc.token); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// slowReviews answers every review after release is closed, and counts them.
type slowReviews struct {
	mu      sync.Mutex
	calls   int
	release chan struct{}
}

func (s *slowReviews) Create(_ context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	<-s.release
	return tr.DeepCopy(), nil // not authenticated
}

// TestReviewerGuards: concurrent reviews of one token share one TokenReview; a
// flood of refused tokens leaves the accepted ones cached; unknown tokens past the
// source's limit are not reviewed.
func TestReviewerGuards(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	s := &slowReviews{release: make(chan struct{})}
	r, err := New(s, Options{Clock: clk, MaxRefused: 4, ReviewBurstPerSource: 10, ReviewsPerSource: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := WithSource(t.Context(), "10.0.0.1")
	tok := fitToken(clk.Now(), `,"sub":"one"`)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			var refused *RefusedError
			if _, err := r.Review(ctx, tok); !errors.As(err, &refused) {
				t.Errorf("a concurrent review: %v, want a refusal", err)
			}
		})
	}
	testenv.Eventually(t, 5*time.Second, time.Millisecond, func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.calls > 0, "waiting for the first review"
	})
	close(s.release)
	wg.Wait()
	if s.calls != 1 {
		t.Errorf("20 concurrent reviews of one token made %d TokenReviews, want 1", s.calls)
	}
	r.store(r.entries, r.opts.MaxEntries, [32]byte{1}, entry{expires: clk.Now().Add(time.Hour)}, clk.Now())
	var limited *LimitedError
	for i := range 12 {
		_, err := r.Review(ctx, fitToken(clk.Now(), fmt.Sprintf(`,"n":%d`, i)))
		if i >= 9 && !errors.As(err, &limited) {
			t.Errorf("unknown token %d of one source past its burst of 10: %v, want a LimitedError", i+2, err)
		}
	}
	if len(r.refused) > 4 || len(r.entries) != 1 {
		t.Errorf("%d refused and %d accepted answers cached, want at most 4 refused and the accepted one kept", len(r.refused), len(r.entries))
	}
}

package satoken

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/gateway/tenancy"
)

func TestIdentify(t *testing.T) {
	sa := func(user string, audiences ...string) authnv1.TokenReviewStatus {
		return authnv1.TokenReviewStatus{Authenticated: true, Audiences: audiences, User: authnv1.UserInfo{Username: user}}
	}
	for _, tc := range []struct {
		name    string
		status  authnv1.TokenReviewStatus
		want    tenancy.Identity
		wantErr string
	}{
		{name: "a ServiceAccount of team-a", status: sa("system:serviceaccount:team-a:ci", "macfleet"),
			want: tenancy.Identity{Namespace: "team-a", Name: "system:serviceaccount:ci"}},
		{name: "among other audiences", status: sa("system:serviceaccount:team-a:ci", "other", "macfleet"),
			want: tenancy.Identity{Namespace: "team-a", Name: "system:serviceaccount:ci"}},
		{name: "not authenticated, with the API server's reason", status: authnv1.TokenReviewStatus{Error: "token has expired"},
			wantErr: "not authenticated: token has expired"},
		{name: "not authenticated", status: authnv1.TokenReviewStatus{}, wantErr: "not authenticated (expired"},
		{name: "another audience", status: sa("system:serviceaccount:team-a:ci", "https://kubernetes.default.svc"),
			wantErr: `not for audience "macfleet"`},
		{name: "no audience in the answer", status: sa("system:serviceaccount:team-a:ci"), wantErr: `not for audience "macfleet"`},
		{name: "a user, not a ServiceAccount", status: sa("alice", "macfleet"), wantErr: `"alice" is not a ServiceAccount`},
		{name: "a node", status: sa("system:node:mac-1", "macfleet"), wantErr: "is not a ServiceAccount"},
		{name: "no name", status: sa("system:serviceaccount:team-a:", "macfleet"), wantErr: "is not a ServiceAccount"},
		{name: "no namespace", status: sa("system:serviceaccount::ci", "macfleet"), wantErr: "is not a ServiceAccount"},
		{name: "too many parts", status: sa("system:serviceaccount:team-a:ci:x", "macfleet"), wantErr: "is not a ServiceAccount"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Identify(tc.status, "macfleet")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Identify = %+v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("identity (-want +got):\n%s", diff)
			}
		})
	}
}

// jwt is a token shaped like a ServiceAccount token with these claims (unsigned: only
// the API server checks signatures).
func jwt(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256","kid":"k"}`)) + "." + enc([]byte(claims)) + "." + enc([]byte("signature"))
}

// fitToken is a token that Fit lets through at now (for audience macfleet, expiring
// in an hour), with more claims after its own.
func fitToken(now time.Time, more string) string {
	return jwt(fmt.Sprintf(`{"aud":["macfleet"],"exp":%d%s}`, now.Unix()+3600, more))
}

func TestLooksLikeToken(t *testing.T) {
	for tok, want := range map[string]bool{
		jwt(`{"sub":"system:serviceaccount:a:b"}`):         true,
		"3f9a0c1b2d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f506": false, // a key of openssl rand -hex 24
		"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0":             false, // two parts
		"eyJ.a b.c":                                        false,
		"":                                                 false,
		"abc.def.ghi":                                      false,
	} {
		if got := LooksLikeToken(tok); got != want {
			t.Errorf("LooksLikeToken(%q) = %v, want %v", tok, got, want)
		}
	}
}

func TestExpiry(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ttl := 10 * time.Second
	for name, tc := range map[string]struct {
		token string
		want  time.Time
	}{
		"expires after the TTL":  {jwt(fmt.Sprintf(`{"exp":%d}`, now.Unix()+3600)), now.Add(ttl)},
		"expires within the TTL": {jwt(fmt.Sprintf(`{"exp":%d}`, now.Unix()+3)), now.Add(3 * time.Second)},
		"already expired":        {jwt(fmt.Sprintf(`{"exp":%d}`, now.Unix()-5)), now.Add(-5 * time.Second)},
		"no exp":                 {jwt(`{"sub":"x"}`), now.Add(ttl)},
		"no JSON":                {"eyJ.bm90IGpzb24.c2ln", now.Add(ttl)},
		"not a JWT":              {"opaque", now.Add(ttl)},
	} {
		if got := Expiry(tc.token, now, ttl); !got.Equal(tc.want) {
			t.Errorf("%s: Expiry = %v, want %v", name, got, tc.want)
		}
	}
}

// fakeReviews answers TokenReviews from a table of tokens and counts them; it is the
// API server only for the cache's timing, which the e2e test cannot control.
type fakeReviews struct {
	mu      sync.Mutex
	users   map[string]string // token → username; absent: not authenticated
	calls   int
	failing bool
}

func (f *fakeReviews) Create(_ context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.failing {
		return nil, errors.New("connection refused")
	}
	out := tr.DeepCopy()
	if u, ok := f.users[tr.Spec.Token]; ok {
		out.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences, User: authnv1.UserInfo{Username: u}}
	}
	return out, nil
}

func (f *fakeReviews) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func TestReviewerCachesWithinTTL(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	tokA := fitToken(clk.Now(), "")
	bad := fitToken(clk.Now(), `,"sub":"forged"`)
	f := &fakeReviews{users: map[string]string{tokA: "system:serviceaccount:team-a:ci"}}
	reg := prometheus.NewRegistry()
	r, err := New(f, Options{TTL: 10 * time.Second, Clock: clk, Registerer: reg, Component: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	want := tenancy.Identity{Namespace: "team-a", Name: "system:serviceaccount:ci"}
	for i := range 3 {
		id, err := r.Review(ctx, tokA)
		if err != nil || id != want {
			t.Fatalf("review %d: %+v, %v; want %+v", i, id, err, want)
		}
	}
	if n := f.count(); n != 1 {
		t.Errorf("three reviews of one token within the TTL asked the API server %d times, want 1", n)
	}
	// The ServiceAccount is deleted: its token works until the TTL, then not.
	f.mu.Lock()
	delete(f.users, tokA)
	f.mu.Unlock()
	clk.SetTime(clk.Now().Add(9 * time.Second))
	if _, err := r.Review(ctx, tokA); err != nil {
		t.Errorf("within the TTL: %v, want the cached identity", err)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	var refused *RefusedError
	if _, err := r.Review(ctx, tokA); !errors.As(err, &refused) {
		t.Errorf("after the TTL, the ServiceAccount deleted: %v, want a RefusedError", err)
	}
	if n := f.count(); n != 2 {
		t.Errorf("API server asked %d times, want 2", n)
	}

	// A refusal is cached too, so a flood of one bad token costs one review per TTL.
	for range 3 {
		if _, err := r.Review(ctx, bad); !errors.As(err, &refused) || strings.Contains(err.Error(), bad) {
			t.Fatalf("a forged token: %v, want a RefusedError that does not hold the token", err)
		}
	}
	if n := f.count(); n != 3 {
		t.Errorf("API server asked %d times, want 3", n)
	}

	// A token expiring within the TTL is not reused past its expiry, nor reviewed
	// again: Fit refuses it.
	tokShort := jwt(fmt.Sprintf(`{"aud":"macfleet","exp":%d}`, clk.Now().Unix()+2))
	f.mu.Lock()
	f.users[tokShort] = "system:serviceaccount:team-a:short"
	f.mu.Unlock()
	if _, err := r.Review(ctx, tokShort); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(2 * time.Second))
	before := f.count()
	if _, err := r.Review(ctx, tokShort); !errors.As(err, &refused) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("a token past its own exp: %v, want it refused as expired", err)
	}
	if f.count() != before {
		t.Errorf("a token past its own exp was reviewed")
	}

	// An API server that cannot be asked: an error that is not a refusal, not cached.
	f.mu.Lock()
	f.failing = true
	f.mu.Unlock()
	other := fitToken(clk.Now(), `,"sub":"new"`)
	for range 2 {
		if _, err := r.Review(ctx, other); err == nil || errors.As(err, &refused) {
			t.Errorf("the API server failing: %v, want an error that is not a refusal", err)
		}
	}
	if n := f.count(); n != before+2 {
		t.Errorf("failed reviews were cached: %d calls, want %d", n, before+2)
	}
	// Every answer above, counted by how it was made.
	for result, want := range map[string]float64{ResultCached: 5, ResultAccepted: 2, ResultRefused: 2, ResultFailed: 2, ResultUnfit: 1} {
		if got := testutil.ToFloat64(r.counted.WithLabelValues(result)); got != want {
			t.Errorf("macfleet_test_token_reviews_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}

// TestReviewerKeepsAcceptedThroughLimits: past its TTL an accepted token is reviewed
// again when the limits allow, and answered from its acceptance when they do not,
// until its own expiry; a token never accepted is limited; a refusal withdraws the
// kept acceptance.
func TestReviewerKeepsAcceptedThroughLimits(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	tokA := fitToken(clk.Now(), `,"sub":"system:serviceaccount:team-a:ci"`)
	tokNew := fitToken(clk.Now(), `,"sub":"system:serviceaccount:team-a:new"`)
	f := &fakeReviews{users: map[string]string{tokA: "system:serviceaccount:team-a:ci", tokNew: "system:serviceaccount:team-a:new"}}
	r, err := New(f, Options{TTL: 10 * time.Second, Clock: clk, Reviews: 0.001, ReviewBurst: 2,
		Registerer: prometheus.NewRegistry(), Component: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := r.Review(ctx, tokA); err != nil {
		t.Fatal(err)
	}
	var limited *LimitedError
	var refused *RefusedError
	if _, err := r.Review(ctx, fitToken(clk.Now(), `,"sub":"system:serviceaccount:team-b:forged"`)); !errors.As(err, &refused) {
		t.Fatalf("a forged token within the limits: %v, want it reviewed and refused", err)
	}
	clk.SetTime(clk.Now().Add(time.Minute))
	if id, err := r.Review(ctx, tokA); err != nil || id.Namespace != "team-a" {
		t.Errorf("an accepted token past its TTL, reviews limited: %+v %v, want its kept identity", id, err)
	}
	if _, err := r.Review(ctx, tokNew); !errors.As(err, &limited) {
		t.Errorf("a token never accepted, reviews limited: %v, want a LimitedError", err)
	}
	if n := f.count(); n != 2 {
		t.Errorf("the API server was asked %d times, want 2", n)
	}
	// A refusal withdraws the acceptance: the ServiceAccount deleted, the next
	// allowed review refuses tokA, and it is not answered from the kept one again.
	f.mu.Lock()
	delete(f.users, tokA)
	f.mu.Unlock()
	r.limits.all.SetBurstAt(clk.Now(), 3)
	r.limits.all.SetLimitAt(clk.Now(), 1000)
	clk.SetTime(clk.Now().Add(time.Second))
	for i := range 2 {
		if _, err := r.Review(ctx, tokA); !errors.As(err, &refused) {
			t.Errorf("review %d after the ServiceAccount's deletion: %v, want a RefusedError", i, err)
		}
	}
	if got := testutil.ToFloat64(r.counted.WithLabelValues(ResultKept)); got != 1 {
		t.Errorf("kept answers: %v, want 1", got)
	}
	// Past the token's own expiry nothing is kept: Fit refuses it.
	clk.SetTime(clk.Now().Add(2 * time.Hour))
	if _, err := r.Review(ctx, tokA); !errors.As(err, &refused) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("past the token's expiry: %v, want it refused as expired", err)
	}
}

func TestReviewerCacheIsBounded(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	f := &fakeReviews{users: map[string]string{}}
	r, err := New(f, Options{MaxEntries: 8, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		tok := fitToken(clk.Now(), fmt.Sprintf(`,"n":%d`, i))
		f.users[tok] = fmt.Sprintf("system:serviceaccount:ns:sa-%d", i)
		if _, err := r.Review(t.Context(), tok); err != nil {
			t.Fatal(err)
		}
		if n := r.Len(); n > 8 {
			t.Fatalf("after %d tokens the cache holds %d answers, more than its bound of 8", i+1, n)
		}
	}
	if n := r.Len(); n != 8 {
		t.Errorf("the cache holds %d answers, want 8", n)
	}
}

// TestReviewersShareTheCounter: two reviewers on one registry (two gateways in one
// process) count into one counter.
func TestReviewersShareTheCounter(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := &fakeReviews{users: map[string]string{}}
	var rs []*Reviewer
	for range 2 {
		r, err := New(f, Options{Registerer: reg, Component: "test"})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	for _, r := range rs {
		_, _ = r.Review(t.Context(), fitToken(time.Now(), `,"sub":"x"`))
	}
	if got := testutil.ToFloat64(rs[0].counted.WithLabelValues(ResultRefused)); got != 2 {
		t.Errorf("refused = %v, want 2 from the two reviewers", got)
	}
}

package v1alpha1_test

import (
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestTokenBudgetValidation creates TokenBudgets on the real API server: each is
// accepted, or rejected with the message of the rule it breaks.
func TestTokenBudgetValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	for i, tc := range []struct {
		name    string
		spec    mfv1.TokenBudgetSpec
		wantErr string
	}{
		{name: "a namespace's minute", spec: mfv1.TokenBudgetSpec{TokensPerMinute: ptr.To[int64](1000)}},
		{name: "a key's day", spec: mfv1.TokenBudgetSpec{Key: "ci", TokensPerDay: ptr.To[int64](1_000_000)}},
		{name: "a ServiceAccount's concurrency", spec: mfv1.TokenBudgetSpec{Key: "system:serviceaccount:batch",
			ConcurrentRequests: ptr.To[int32](2)}},
		{name: "every limit", spec: mfv1.TokenBudgetSpec{TokensPerMinute: ptr.To[int64](1), TokensPerHour: ptr.To[int64](2),
			TokensPerDay: ptr.To[int64](3), ConcurrentRequests: ptr.To[int32](4)}},
		{name: "zero: nothing admitted", spec: mfv1.TokenBudgetSpec{TokensPerDay: ptr.To[int64](0)}},
		{name: "no limit", spec: mfv1.TokenBudgetSpec{Key: "ci"},
			wantErr: "a TokenBudget sets at least one of tokensPerMinute, tokensPerHour, tokensPerDay and concurrentRequests"},
		{name: "negative", spec: mfv1.TokenBudgetSpec{TokensPerHour: ptr.To[int64](-1)},
			wantErr: "spec.tokensPerHour: Invalid value: -1: spec.tokensPerHour in body should be greater than or equal to 0"},
		{name: "negative concurrency", spec: mfv1.TokenBudgetSpec{ConcurrentRequests: ptr.To[int32](-2)},
			wantErr: "spec.concurrentRequests in body should be greater than or equal to 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := env.Client.Create(t.Context(), &mfv1.TokenBudget{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tb-" + strconv.Itoa(i)}, Spec: tc.spec})
			checkErr(t, err, tc.wantErr)
		})
	}
}

// TestTokenBudgetLeasesValidation writes leases into a TokenBudget's status on the
// real API server, as a gateway replica does: bounded counts, a known window and at
// most 64 leases.
func TestTokenBudgetLeasesValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	now := metav1.NewTime(time.Now().UTC().Truncate(time.Minute))
	lease := func(tokens int64, w mfv1.LeaseWindow) mfv1.TokenLease {
		return mfv1.TokenLease{Gateway: "gw-0", Window: w, Start: now, Tokens: tokens, RenewTime: metav1.NewMicroTime(now.Time)}
	}
	many := make([]mfv1.TokenLease, 65)
	for i := range many {
		many[i] = lease(1, mfv1.LeaseMinute)
		many[i].Gateway = "gw-" + strconv.Itoa(i)
	}
	for i, tc := range []struct {
		name    string
		leases  []mfv1.TokenLease
		wantErr string
	}{
		{name: "a minute's lease", leases: []mfv1.TokenLease{lease(50, mfv1.LeaseMinute), lease(0, mfv1.LeaseDay)}},
		{name: "negative tokens", leases: []mfv1.TokenLease{lease(-1, mfv1.LeaseHour)},
			wantErr: "status.leases[0].tokens: Invalid value: -1: leases[0].tokens in body should be greater than or equal to 0"},
		{name: "an unknown window", leases: []mfv1.TokenLease{lease(1, "concurrent")},
			wantErr: `status.leases[0].window: Unsupported value: "concurrent"`},
		{name: "no gateway", leases: []mfv1.TokenLease{{Window: mfv1.LeaseMinute, Start: now, RenewTime: metav1.NewMicroTime(now.Time)}},
			wantErr: "leases[0].gateway in body should be at least 1 chars long"},
		{name: "too many", leases: many, wantErr: "status.leases: Too many: 65: must have at most 64 items"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leased-" + strconv.Itoa(i)},
				Spec: mfv1.TokenBudgetSpec{TokensPerMinute: ptr.To[int64](100)}}
			if err := env.Client.Create(t.Context(), b); err != nil {
				t.Fatal(err)
			}
			b.Status.Leases = tc.leases
			checkErr(t, env.Client.Status().Update(t.Context(), b), tc.wantErr)
		})
	}
}

// TestTokenUsageValidation: a record's day is a date, and its counts are between 0
// and mfv1.MaxUsageCount (the gateway's ledger saturates there).
func TestTokenUsageValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	today := time.Now().UTC().Format(time.DateOnly)
	usage := func(u mfv1.KeyUsage) []mfv1.KeyUsage {
		u.Key, u.Deployment = "ci", "team-a/qwen"
		return []mfv1.KeyUsage{u}
	}
	window := func(w mfv1.KeyWindow) []mfv1.KeyWindow {
		w.Key = "ci"
		return []mfv1.KeyWindow{w}
	}
	for i, tc := range []struct {
		name, gateway, day string
		usage              []mfv1.KeyUsage
		windows            []mfv1.KeyWindow
		wantErr            string
	}{
		{name: "a day", gateway: "gw-0", day: today},
		{name: "not a date", gateway: "gw-0", day: "25/11/2026", wantErr: `spec.day in body should match`},
		{name: "no gateway", day: "2026-11-25", wantErr: "spec.gateway in body should be at least 1 chars long"},
		{name: "every count at the maximum", gateway: "gw-0", day: today,
			usage: usage(mfv1.KeyUsage{Requests: mfv1.MaxUsageCount, InputTokens: mfv1.MaxUsageCount,
				CachedTokens: mfv1.MaxUsageCount, OutputTokens: mfv1.MaxUsageCount}),
			windows: window(mfv1.KeyWindow{MinuteTokens: mfv1.MaxUsageCount, HourTokens: mfv1.MaxUsageCount, InFlight: 1})},
		{name: "negative input", gateway: "gw-0", day: today, usage: usage(mfv1.KeyUsage{InputTokens: -1}),
			wantErr: "spec.usage[0].inputTokens in body should be greater than or equal to 0"},
		{name: "negative requests", gateway: "gw-0", day: today, usage: usage(mfv1.KeyUsage{Requests: -1}),
			wantErr: "spec.usage[0].requests in body should be greater than or equal to 0"},
		{name: "output over the maximum", gateway: "gw-0", day: today, usage: usage(mfv1.KeyUsage{OutputTokens: mfv1.MaxUsageCount + 1}),
			wantErr: "spec.usage[0].outputTokens in body should be less than or equal to 9007199254740991"},
		{name: "negative minute", gateway: "gw-0", day: today, windows: window(mfv1.KeyWindow{MinuteTokens: -1 << 62}),
			wantErr: "spec.windows[0].minuteTokens in body should be greater than or equal to 0"},
		{name: "negative requests in flight", gateway: "gw-0", day: today, windows: window(mfv1.KeyWindow{InFlight: -3}),
			wantErr: "spec.windows[0].inFlight in body should be greater than or equal to 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := env.Client.Create(t.Context(), &mfv1.TokenUsage{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tu-" + strconv.Itoa(i)},
				Spec:       mfv1.TokenUsageSpec{Gateway: tc.gateway, Day: tc.day, Usage: tc.usage, Windows: tc.windows}})
			checkErr(t, err, tc.wantErr)
		})
	}
}

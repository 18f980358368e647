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

// TestTokenUsageValidation: a record's day is a date.
func TestTokenUsageValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	for i, tc := range []struct {
		name, gateway, day, wantErr string
	}{
		{name: "a day", gateway: "gw-0", day: time.Now().UTC().Format(time.DateOnly)},
		{name: "not a date", gateway: "gw-0", day: "25/11/2026", wantErr: `spec.day in body should match`},
		{name: "no gateway", day: "2026-11-25", wantErr: "spec.gateway in body should be at least 1 chars long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := env.Client.Create(t.Context(), &mfv1.TokenUsage{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tu-" + strconv.Itoa(i)},
				Spec:       mfv1.TokenUsageSpec{Gateway: tc.gateway, Day: tc.day}})
			checkErr(t, err, tc.wantErr)
		})
	}
}

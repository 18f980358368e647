package report

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

func ledger(ns, gateway, day string, usage ...mfv1.KeyUsage) mfv1.TokenUsage {
	return mfv1.TokenUsage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gateway + "-" + day},
		Spec: mfv1.TokenUsageSpec{Gateway: gateway, Day: day, Usage: usage}}
}

func use(key, dep string, req, in, cached, out int64) mfv1.KeyUsage {
	return mfv1.KeyUsage{Key: key, Deployment: dep, Requests: req, InputTokens: in, CachedTokens: cached, OutputTokens: out}
}

func TestAggregate(t *testing.T) {
	items := []mfv1.TokenUsage{
		// Two gateway replicas counted team-a's ci key on the same day.
		ledger("team-a", "gw-0", "2026-11-24", use("ci", "team-a/qwen", 3, 300, 100, 30), use("ci", "team-b/llama", 1, 10, 0, 5)),
		ledger("team-a", "gw-1", "2026-11-24", use("ci", "team-a/qwen", 2, 200, 50, 20), use("dev", "team-a/qwen", 1, 7, 0, 1)),
		ledger("team-a", "gw-0", "2026-11-25", use("ci", "team-a/qwen", 1, 11, 0, 2)),
		ledger("team-a", "gw-0", "2026-11-20", use("ci", "team-a/qwen", 9, 99, 9, 9)),
		ledger("team-b", "gw-0", "2026-11-24", use("ops", "team-b/llama", 4, 40, 4, 4)),
	}
	tests := []struct {
		name string
		q    Query
		want []Row
	}{
		{"per key, one namespace, a range", Query{Namespace: "team-a", From: "2026-11-24", To: "2026-11-25"}, []Row{
			{Day: "2026-11-24", Namespace: "team-a", Key: "ci", Requests: 6, InputTokens: 510, CachedTokens: 150, OutputTokens: 55},
			{Day: "2026-11-24", Namespace: "team-a", Key: "dev", Requests: 1, InputTokens: 7, OutputTokens: 1},
			{Day: "2026-11-25", Namespace: "team-a", Key: "ci", Requests: 1, InputTokens: 11, OutputTokens: 2},
		}},
		{"per deployment", Query{Namespace: "team-a", From: "2026-11-24", To: "2026-11-24", ByDeployment: true}, []Row{
			{Day: "2026-11-24", Namespace: "team-a", Key: "ci", Deployment: "team-a/qwen", Requests: 5, InputTokens: 500, CachedTokens: 150, OutputTokens: 50},
			{Day: "2026-11-24", Namespace: "team-a", Key: "ci", Deployment: "team-b/llama", Requests: 1, InputTokens: 10, OutputTokens: 5},
			{Day: "2026-11-24", Namespace: "team-a", Key: "dev", Deployment: "team-a/qwen", Requests: 1, InputTokens: 7, OutputTokens: 1},
		}},
		{"every namespace, open range", Query{From: "2026-11-24"}, []Row{
			{Day: "2026-11-24", Namespace: "team-a", Key: "ci", Requests: 6, InputTokens: 510, CachedTokens: 150, OutputTokens: 55},
			{Day: "2026-11-24", Namespace: "team-a", Key: "dev", Requests: 1, InputTokens: 7, OutputTokens: 1},
			{Day: "2026-11-24", Namespace: "team-b", Key: "ops", Requests: 4, InputTokens: 40, CachedTokens: 4, OutputTokens: 4},
			{Day: "2026-11-25", Namespace: "team-a", Key: "ci", Requests: 1, InputTokens: 11, OutputTokens: 2},
		}},
		{"a namespace without usage", Query{Namespace: "team-c"}, []Row{}},
		{"before the first day", Query{Namespace: "team-a", To: "2026-11-19"}, []Row{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := cmp.Diff(tt.want, Aggregate(items, tt.q)); d != "" {
				t.Errorf("Aggregate (-want +got):\n%s", d)
			}
		})
	}
	all := Aggregate(items, Query{})
	if got, want := Total(all), (Row{Requests: 21, InputTokens: 667, CachedTokens: 163, OutputTokens: 71}); got != want {
		t.Errorf("Total = %+v, want %+v", got, want)
	}
}

func TestDays(t *testing.T) {
	now := time.Date(2026, 11, 25, 23, 59, 0, 0, time.FixedZone("UTC-5", -5*3600)) // 2026-11-26 in UTC
	tests := []struct {
		days            int
		since           string
		from, to, error string
	}{
		{days: 1, from: "2026-11-26", to: "2026-11-26"},
		{days: 7, from: "2026-11-20", to: "2026-11-26"},
		{days: 30, from: "2026-10-28", to: "2026-11-26"},
		{days: 7, since: "2026-11-01", from: "2026-11-01", to: "2026-11-26"},
		{days: 0, error: "--days 0: count at least 1 day (today)"},
		{days: 7, since: "11/01/2026", error: `--since "11/01/2026": want a UTC day as YYYY-MM-DD`},
		{days: 7, since: "2026-11-27", error: "--since 2026-11-27 is after today (2026-11-26, UTC)"},
	}
	for _, tt := range tests {
		from, to, err := Days(now, tt.days, tt.since)
		var msg string
		if err != nil {
			msg = err.Error()
		}
		if from != tt.from || to != tt.to || msg != tt.error {
			t.Errorf("Days(%d, %q) = %q, %q, %q; want %q, %q, %q", tt.days, tt.since, from, to, msg, tt.from, tt.to, tt.error)
		}
	}
}

package gateway_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/ledger"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The bound of one chat completion on the fleets of these tests: their replicas'
// contextLength (4096, the CRD's default) plus what llama.cpp may round a slot up by
// (metering.SlotRounding), and the request's max_tokens.
const (
	boundInput  = 4096 + 512
	boundOutput = 16
	cappedChat  = `{"model":"qwen","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
)

// keyRecord waits until the gateway gw's record of the day in ns holds a usage row of
// key ci for which ok holds, and returns it.
func keyRecord(t *testing.T, e *testenv.Env, ns, gw string, ok func(mfv1.KeyUsage) bool) mfv1.KeyUsage {
	t.Helper()
	name := ledger.RecordName(gw, time.Now())
	var got mfv1.KeyUsage
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		var tu mfv1.TokenUsage
		if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &tu); err != nil {
			return false, err.Error()
		}
		for _, u := range tu.Spec.Usage {
			if u.Key == "ci" && ok(u) {
				got = u
				return true, ""
			}
		}
		return false, fmt.Sprintf("record %s: %+v", name, tu.Spec.Usage)
	})
	return got
}

// metricLine waits until the gateway's /metrics has a line starting with prefix and
// returns it.
func metricLine(t *testing.T, g runningGateway, prefix string) string {
	t.Helper()
	var line string
	testenv.Eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := get(g.metrics + "/metrics")
		for l := range strings.Lines(body) {
			if strings.HasPrefix(l, prefix) {
				line = strings.TrimSpace(l)
				return true, ""
			}
		}
		return false, fmt.Sprintf("/metrics (%d) has no %s", code, prefix)
	})
	return line
}

// TestAttackForgedUsageChargesAVictim: a compromised Mac answers a team's requests
// with a forged usage trailer of 2^62 input, cached and output tokens each, to charge
// the team a fortune or, the two summed, to wrap its day negative and so switch its
// TokenBudget off. The gateway must now count each answer at the request's bound
// (the replica's context for the prompt, the request's max_tokens for the output), in
// the team's TokenUsage record and the usage metrics, count the cut in
// macfleet_gateway_usage_clamped_total, and keep enforcing the budget: of 5,000
// tokens a day, two bounded answers (4,624 tokens each) fill it.
func TestAttackForgedUsageChargesAVictim(t *testing.T) {
	e := cluster(t)
	const forged = "input=4611686018427387904 cached=4611686018427387904 output=4611686018427387904"
	f, key := reportingFleet(t, e, func(int) string { return forged })
	b := &mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "day"},
		Spec: mfv1.TokenBudgetSpec{TokensPerDay: ptr.To[int64](5000)}}
	if err := e.Client.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	const id = "gw-forged"
	g := startGateway(t, e, gateway.Config{TenantKeys: true, GatewayID: id, MetricsListener: loopback(t)})
	chat := func() (int, string) {
		return send(http.MethodPost, g.url+"/v1/chat/completions", cappedChat, key)
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := chat()
		return code == http.StatusOK, fmt.Sprintf("the first request: %d %s", code, body)
	})
	if code, body := chat(); code != http.StatusOK {
		t.Fatalf("4,624 of 5,000 tokens used, the second request: %d %s", code, body)
	}
	code, body := chat()
	if code != http.StatusTooManyRequests || !strings.Contains(body, "allows 5000 tokens per day") {
		t.Errorf("two answers counted, the third request: %d %s; want the budget's 429 (the forged usage must not switch it off)", code, body)
	}

	want := mfv1.KeyUsage{Key: "ci", Deployment: f.ns + "/qwen", Requests: 2,
		InputTokens: 2 * boundInput, CachedTokens: 2 * boundInput, OutputTokens: 2 * boundOutput}
	got := keyRecord(t, e, f.ns, id, func(u mfv1.KeyUsage) bool { return u.Requests >= 2 })
	if got != want {
		t.Errorf("the victim's record: %+v, want two answers at the bound: %+v", got, want)
	}
	for _, tc := range []struct{ series, want string }{
		{`macfleet_usage_tokens_total{deployment="` + f.ns + `/qwen",key="ci",namespace="` + f.ns + `",type="input"}`, fmt.Sprint(2 * boundInput)},
		{`macfleet_usage_tokens_total{deployment="` + f.ns + `/qwen",key="ci",namespace="` + f.ns + `",type="output"}`, fmt.Sprint(2 * boundOutput)},
		{`macfleet_gateway_usage_clamped_total{model="` + f.ns + `/qwen",reason="input_over_bound"}`, "2"},
		{`macfleet_gateway_usage_clamped_total{model="` + f.ns + `/qwen",reason="output_over_bound"}`, "2"},
	} {
		if line := metricLine(t, g, tc.series); line != tc.series+" "+tc.want {
			t.Errorf("metric %q, want %s", line, tc.want)
		}
	}
}

// TestAttackNegativeUsage: a compromised Mac reports negative usage, and whoever may
// write TokenUsage records (a gateway's identity) writes a record of another replica
// with negative tokens, each to give a team tokens back and lift its budget. The
// report must count nothing (macfleet_gateway_usage_clamped_total counts it as
// unreadable), the record must be refused by the API server, and the team's budget
// of 15 tokens a day beyond a request's reservation (chatAsk) still refuses it once
// two answers of 10 tokens fill it.
func TestAttackNegativeUsage(t *testing.T) {
	e := cluster(t)
	const honest, negative = "input=7 cached=2 output=3", "input=-1000000000 cached=0 output=-5"
	f, key := reportingFleet(t, e, func(n int) string {
		if n == 2 {
			return negative
		}
		return honest
	})
	b := &mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "day"},
		Spec: mfv1.TokenBudgetSpec{TokensPerDay: ptr.To[int64](15 + chatAsk)}}
	if err := e.Client.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	day := time.Now().UTC().Format(time.DateOnly)
	forged := &mfv1.TokenUsage{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "gw-forger." + day},
		Spec: mfv1.TokenUsageSpec{Gateway: "gw-forger", Day: day, Usage: []mfv1.KeyUsage{
			{Key: "ci", Deployment: f.ns + "/qwen", Requests: 1, InputTokens: -1_000_000_000}}}}
	err := e.Client.Create(t.Context(), forged)
	if err == nil {
		f.cleanup(forged)
	}
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "greater than or equal to 0") {
		t.Errorf("a record of -1,000,000,000 input tokens: %v, want Invalid", err)
	}

	const id = "gw-negative"
	g := startGateway(t, e, gateway.Config{TenantKeys: true, GatewayID: id, MetricsListener: loopback(t)})
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := chatAs(g, key)
		return code == http.StatusOK, fmt.Sprintf("the first request: %d %s", code, body)
	})
	for i, what := range []string{"the negative report", "the third answer"} {
		if code, body := chatAs(g, key); code != http.StatusOK {
			t.Fatalf("10 of %d tokens used, request %d (%s): %d %s", 15+chatAsk, i+2, what, code, body)
		}
	}
	code, body := chatAs(g, key)
	if code != http.StatusTooManyRequests || !strings.Contains(body, fmt.Sprintf("allows %d tokens per day: 20 were used", 15+chatAsk)) {
		t.Errorf("20 of %d tokens used, the fourth request: %d %s; want the budget's 429", 15+chatAsk, code, body)
	}
	got := keyRecord(t, e, f.ns, id, func(u mfv1.KeyUsage) bool { return u.Requests >= 2 })
	if want := (mfv1.KeyUsage{Key: "ci", Deployment: f.ns + "/qwen", Requests: 2, InputTokens: 14, CachedTokens: 4,
		OutputTokens: 6}); got != want {
		t.Errorf("the team's record: %+v, want the two honest answers only: %+v", got, want)
	}
	line := metricLine(t, g, `macfleet_gateway_usage_clamped_total{model="`+f.ns+`/qwen",reason="unreadable"}`)
	if line != `macfleet_gateway_usage_clamped_total{model="`+f.ns+`/qwen",reason="unreadable"} 1` {
		t.Errorf("metric %q, want 1 unreadable report", line)
	}
}

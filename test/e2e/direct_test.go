package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestBudgetedNamespacesGoThroughTheGateway is a workload of team A calling its own
// deployment's Service (an agent of its EndpointSlice) with its ServiceAccount token:
//   - served, while team A has no TokenBudget, and counted by the agent in the usage
//     counters the gateways export, exactly as the answers' usage;
//   - once team A has a TokenBudget, refused within seconds with a 403 naming the
//     budget and the gateway, while the same token through the gateway is served,
//     counted and held to the budget (429 once it is spent);
//   - served directly again once the budget is deleted.
//
// The gateway's requests to the agent, with the fleet token, are not counted again on
// the agent. Without the refusal (the code before it), the direct call under a budget
// is served: the attack this closes.
func TestBudgetedNamespacesGoThroughTheGateway(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "chat", 1))
	create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"}})
	base, reg := inProcessGateway(t, gateway.Config{TenantKeys: true, GatewayID: "gw-direct-" + ns}, testr.New(t))
	waitReady(t, ns, "chat", 1, 3*time.Minute)
	agent := localfleet.AgentURL(sliceAddresses(t, ns, "chat", 1)[0])
	tok := serviceAccountToken(t, ns, "app", satoken.DefaultAudience)
	body := `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"Count to three."}]}`

	// direct posts to the Service and, when it is served, adds its usage to answered.
	var answered metering.Usage
	var answers int
	direct := func() (int, string) {
		t.Helper()
		code, b := call(t, agent, http.MethodPost, "/v1/chat/completions", tok, body)
		if code == http.StatusOK {
			answered = answered.Add(answerUsage(t, b))
			answers++
		}
		return code, b
	}
	if code, b := direct(); code != http.StatusOK {
		t.Fatalf("team A's token on its own Service: %d %s", code, b)
	}
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, b := call(t, base, http.MethodGet, "/v1/models", tok, "")
		return code == http.StatusOK && strings.Contains(b, `"chat"`), fmt.Sprintf("the gateway's models for team A: %d %s", code, b)
	})

	createBudget(t, ns, "team", v1alpha1.TokenBudgetSpec{TokensPerMinute: ptr.To[int64](1)})
	budgeted := time.Now()
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() (bool, string) {
		code, b := direct()
		return code == http.StatusForbidden && strings.Contains(b, "TokenBudget") && strings.Contains(b, "gateway"),
			fmt.Sprintf("team A's token on its Service under a budget: %d %s, want 403 naming the gateway", code, b)
	})
	t.Logf("the budget sent team A's direct calls to the gateway after %v", time.Since(budgeted).Round(time.Millisecond))
	// The Anthropic shape on Messages.
	if code, b := call(t, agent, http.MethodPost, "/v1/messages", tok, body); code != http.StatusForbidden ||
		!strings.Contains(b, `"type":"permission_error"`) || !strings.Contains(b, "gateway") {
		t.Errorf("Messages on the Service under a budget: %d %s, want a 403 permission_error naming the gateway", code, b)
	}
	// Through the gateway: served and counted, then held to the budget (1 token a
	// minute: the request that crosses it is served, the next refused, unless a new
	// minute began in between).
	gatewayLabels := map[string]string{"namespace": ns, "key": satoken.NamePrefix + "app", "deployment": ns + "/chat"}
	before := metricValue(t, reg, "macfleet_usage_requests_total", gatewayLabels)
	refused := false
	for i := 0; i < 5 && !refused; i++ {
		code, b := call(t, base, http.MethodPost, "/v1/chat/completions", tok, body)
		switch {
		case code == http.StatusTooManyRequests && strings.Contains(b, "token_budget_exceeded"):
			refused = i > 0
		case code != http.StatusOK:
			t.Fatalf("through the gateway under the budget: %d %s", code, b)
		}
	}
	if !refused {
		t.Errorf("the gateway served team A's token past its budget")
	}
	if got := metricValue(t, reg, "macfleet_usage_requests_total", gatewayLabels); got <= before {
		t.Errorf("the gateway counted %v requests of team A's token, %v before: want more", got, before)
	}

	if err := fleet.Client.Delete(t.Context(), &v1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"}}); err != nil {
		t.Fatal(err)
	}
	unbudgeted := time.Now()
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() (bool, string) {
		code, b := direct()
		return code == http.StatusOK, fmt.Sprintf("team A's token on its Service without the budget: %d %s", code, b)
	})
	t.Logf("the budget's deletion let team A's direct calls in after %v", time.Since(unbudgeted).Round(time.Millisecond))
	// Through the gateway, which reaches the agent with the fleet token: not counted
	// there again.
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		code, b := call(t, base, http.MethodPost, "/v1/chat/completions", tok, body)
		return code == http.StatusOK, fmt.Sprintf("team A's token through the gateway without the budget: %d %s", code, b)
	})
	if code, b := direct(); code != http.StatusOK {
		t.Fatalf("team A's token on its own Service: %d %s", code, b)
	}

	// The agent counted the answers served directly, exactly, and nothing else (not the
	// gateway's, not the refused).
	labels := map[string]string{"namespace": ns, "key": satoken.NamePrefix + "app", "deployment": ns + "/chat"}
	got, requests := agentUsage(t, agent, labels)
	if got != answered || requests != answers {
		t.Errorf("the agent counted %d requests %+v, the direct answers were %d with usage %+v", requests, got, answers, answered)
	}
	t.Logf("%d direct answers, usage %+v, counted by the agent", answers, answered)
}

// answerUsage is the usage of a chat completion's body.
func answerUsage(t *testing.T, body string) metering.Usage {
	t.Helper()
	var a struct {
		Usage struct {
			PromptTokens        int64 `json:"prompt_tokens"`
			CompletionTokens    int64 `json:"completion_tokens"`
			PromptTokensDetails struct {
				CachedTokens int64 `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &a); err != nil || a.Usage.PromptTokens == 0 {
		t.Fatalf("an answer without usage: %s (%v)", body, err)
	}
	return metering.Usage{Input: a.Usage.PromptTokens, Cached: a.Usage.PromptTokensDetails.CachedTokens, Output: a.Usage.CompletionTokens}
}

// agentUsage reads an agent's usage counters of the series whose labels include want
// (as a gateway).
func agentUsage(t *testing.T, agent string, want map[string]string) (metering.Usage, int) {
	t.Helper()
	fams := agentFamilies(t, agent)
	var u metering.Usage
	var requests int
	for _, name := range []string{"macfleet_usage_requests_total", "macfleet_usage_tokens_total"} {
		eachSeries(fams[name], want, func(got map[string]string, m *dto.Metric) {
			n := int64(m.GetCounter().GetValue())
			switch got["type"] {
			case "":
				requests += int(n)
			case metering.TypeInput:
				u.Input += n
			case metering.TypeCached:
				u.Cached += n
			case metering.TypeOutput:
				u.Output += n
			}
		})
	}
	return u, requests
}

// agentFamilies is an agent's /metrics (read as a gateway), by metric name.
func agentFamilies(t *testing.T, agent string) map[string]*dto.MetricFamily {
	t.Helper()
	code, text := call(t, agent, http.MethodGet, "/metrics", asGateway, "")
	if code != http.StatusOK {
		t.Fatalf("the agent's /metrics: %d %s", code, text)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing the agent's /metrics: %v", err)
	}
	return fams
}

// eachSeries calls f with each series of fam (nil: none) whose labels include want.
func eachSeries(fam *dto.MetricFamily, want map[string]string, f func(labels map[string]string, m *dto.Metric)) {
series:
	for _, m := range fam.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue series
			}
		}
		f(got, m)
	}
}

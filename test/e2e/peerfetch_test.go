package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// postChatAs posts a chat completion to the gateway at base with token.
func postChatAs(ctx context.Context, base, token, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String(), err
}

// streamChat posts body (a chat completion, streamed) to the gateway at base with
// token (none when empty) and returns the answer's text and usage, read from its events.
func streamChat(ctx context.Context, t *testing.T, base, token, body string) (string, metering.Usage) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	m["stream"], m["stream_options"] = true, map[string]bool{"include_usage": true}
	b, _ := json.Marshal(m)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a streamed chat: %d", resp.StatusCode)
	}
	var text strings.Builder
	var u metering.Usage
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *runnerapi.Usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("an event of the stream: %s: %v", data, err)
		}
		for _, c := range ev.Choices {
			text.WriteString(c.Delta.Content)
		}
		if ev.Usage != nil {
			u = metering.Usage{Input: int64(ev.Usage.PromptTokens), Output: int64(ev.Usage.CompletionTokens)}
			if d := ev.Usage.PromptTokensDetails; d != nil {
				u.Cached = int64(d.CachedTokens)
			}
		}
	}
	return text.String(), u
}

// agentCounter sums an agent's counter name over the series whose labels include
// want (read as a gateway).
func agentCounter(t *testing.T, agent, name string, want map[string]string) (sum float64) {
	t.Helper()
	eachSeries(agentFamilies(t, agent)[name], want, func(_ map[string]string, m *dto.Metric) { sum += m.GetCounter().GetValue() })
	return sum
}

// peerTenants is a deployment of team A (namespace ns) granted to team B (nsB), each
// with a ServiceAccount "app" and its token, and an in-process gateway routing by
// prefix cache with tenant keys and peer fetch at a margin that lets any fetch
// through.
type peerTenants struct {
	ns, nsB, model, tokA, tokB, url string
	reg                             *prometheus.Registry
	// gw is the gateway's metric name for the deployment, with labels.
	gw func(name string, labels map[string]string) float64
}

// newPeerTenants creates the namespaces, the deployment name of replicas (16 k
// context, then mutate), the ServiceAccounts and the gateway.
func newPeerTenants(t *testing.T, name string, replicas int32, mutate ...func(*v1alpha1.ModelDeployment)) peerTenants {
	t.Helper()
	s := peerTenants{ns: testenv.NewNamespace(t, fleet.Client), nsB: testenv.NewNamespace(t, fleet.Client)}
	create(t, deployment(s.ns, name, replicas, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Engine.ContextLength = 16384
		md.Spec.Access = &v1alpha1.Access{Namespaces: []string{s.nsB}}
		for _, m := range mutate {
			m(md)
		}
	}))
	for _, n := range []string{s.ns, s.nsB} {
		create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "app"}})
	}
	s.model = s.ns + "/" + name
	s.tokA, s.tokB = serviceAccountToken(t, s.ns, "app", satoken.DefaultAudience), serviceAccountToken(t, s.nsB, "app", satoken.DefaultAudience)
	s.url, s.reg = inProcessGateway(t, gateway.Config{Routing: gateway.RoutingPrefixCache, PeerFetchMargin: 1e-9, TenantKeys: true},
		testr.NewWithInterface(t, testr.Options{Verbosity: 2}))
	s.gw = func(metric string, labels map[string]string) float64 {
		labels["model"] = s.model
		return metricValue(t, s.reg, metric, labels)
	}
	return s
}

// TestPeerFetchRestoresAPrefix: team A's deployment of two replicas, one per simulated
// Mac, behind a gateway with --routing=prefix-cache and peer fetch, called with team
// A's ServiceAccount token (its cache partition is A's). A conversation's first
// turn (streamed: the gateway measures the prefill rate from it) leaves its prefix on
// the replica that answered, P. P is then kept busy with two long answers to the same
// system prompt (routed to P by their prefix) so that the load bound sends the next
// request to the other Mac's replica R, which holds nothing: the gateway asks R's
// agent to fetch the prefix from P's agent (with a ticket for R's Mac), R restores
// it, and its greedy answer is the first turn's. A tenant of another namespace
// granted the deployment sends the same conversation: its partition holds nothing and
// no fetch is asked for it.
//
// The synthesized model prefills so fast that no real link would beat it, so the
// gateway's margin is set to let any fetch through: the decision itself is
// table-tested (gateway/peerfetch), this test is about the wiring and the bytes.
func TestPeerFetchRestoresAPrefix(t *testing.T) {
	s := newPeerTenants(t, "peer", 2)
	ns, model, tokA, tokB, url, reg, gw := s.ns, s.model, s.tokA, s.tokB, s.url, s.reg, s.gw
	replicas := waitReady(t, ns, "peer", 2, 3*time.Minute)
	if replicas[0].Spec.NodeName == replicas[1].Spec.NodeName {
		t.Fatalf("both replicas are on %s; the test needs one per Mac", replicas[0].Spec.NodeName)
	}
	agents := sliceAddresses(t, ns, "peer", 2)
	fetched := func(result string) (n float64) {
		for _, a := range agents {
			n += agentCounter(t, localfleet.AgentURL(a), "macfleet_agent_peer_fetches_total", map[string]string{"result": result})
		}
		return n
	}

	const question = "Review this: func f() { go g() }"
	turn := prefixChat(model, 16, question)
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		// Not the conversation's system prompt: the first turn must prefill it all.
		code, text, err := postChatAs(t.Context(), url, tokA, fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, model))
		return err == nil && code == http.StatusOK, fmt.Sprintf("the gateway does not serve %s yet: %d %s %v", model, code, text, err)
	})
	want, u1 := streamChat(t.Context(), t, url, tokA, turn)
	t.Logf("turn 1: %d prompt tokens (%d cached): %q", u1.Input, u1.Cached, want)
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		n := metricValue(t, reg, "macfleet_gateway_prefix_index_entries", nil)
		return n > 0, "the gateway's prefix index holds nothing after the first turn"
	})

	// Keep the holder P busy with two long answers to the same system prompt.
	stop := busyHolder(t, model, func(ctx context.Context, body string) { _, _, _ = postChatAs(ctx, url, tokA, body) }, gw)
	defer stop()

	// The same conversation again: P is at its load bound, R holds nothing of it.
	code, text, err := postChatAs(t.Context(), url, tokA, turn)
	if err != nil || code != http.StatusOK {
		t.Fatalf("the request for R: %d %s (%v)", code, text, err)
	}
	u2, got := answerUsage(t, text), answerContent(t, text)
	t.Logf("on R: %d prompt tokens (%d cached): %q; decisions %v, fetches imported %v, bytes %v", u2.Input, u2.Cached, got,
		gw("macfleet_gateway_peer_fetch_decisions_total", map[string]string{}), gw("macfleet_gateway_peer_fetches_total", map[string]string{"result": "imported"}),
		gw("macfleet_gateway_peer_fetch_bytes_total", map[string]string{}))
	if n := gw("macfleet_gateway_peer_fetches_total", map[string]string{"result": "imported"}); n != 1 {
		t.Errorf("the gateway counted %v imported peer fetches, want 1 (by result: %v)", n, gw("macfleet_gateway_peer_fetches_total", map[string]string{}))
	}
	if b := gw("macfleet_gateway_peer_fetch_bytes_total", map[string]string{}); b <= 0 {
		t.Errorf("the gateway counted %v bytes moved between Macs", b)
	}
	if n := fetched("imported"); n != 1 {
		t.Errorf("the agents counted %v imported peer fetches, want 1", n)
	}
	if u2.Cached < u1.Input/2 {
		t.Errorf("R restored %d of its %d prompt tokens, want at least the system prompt (about half of %d)", u2.Cached, u2.Input, u1.Input)
	}
	if got != want {
		t.Errorf("R's greedy answer after the peer's state %q differs from the full prefill's %q", got, want)
	}
	stop()

	// Another namespace's tenant, granted the deployment, sends the same conversation:
	// its partition holds nothing, and no fetch is asked.
	decisions := gw("macfleet_gateway_peer_fetch_decisions_total", map[string]string{})
	code, text, err = postChatAs(t.Context(), url, tokB, turn)
	if err != nil || code != http.StatusOK {
		t.Fatalf("the other tenant's request: %d %s (%v)", code, text, err)
	}
	if u := answerUsage(t, text); u.Cached != 0 {
		t.Errorf("another namespace's tenant restored %d tokens of the conversation", u.Cached)
	}
	if d := gw("macfleet_gateway_peer_fetch_decisions_total", map[string]string{}); d != decisions {
		t.Errorf("the other tenant's request was considered for a peer fetch (%v decisions, %v before)", d, decisions)
	}
	if n := fetched("imported"); n != 1 {
		t.Errorf("the agents counted %v imported peer fetches after the other tenant's request, want still 1", n)
	}
}

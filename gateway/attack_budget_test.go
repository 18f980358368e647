package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/engine"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// budgetedTeam is a team namespace whose key is served deployment tiny by a real
// agent (runner process, synthesized model) through a gateway with tenant keys, under
// a TokenBudget of perMinute tokens a minute for the whole namespace.
type budgetedTeam struct {
	g    runningGateway
	f    *fleet
	key  string
	oc   openai.Client
	e    *testenv.Env
	keys string
}

func newBudgetedTeam(t *testing.T, perMinute int64, cold time.Duration) budgetedTeam {
	t.Helper()
	return newBudgetedTeamWith(t, perMinute, cold, engine.Settings{ContextLength: 1024})
}

// newBudgetedTeamWith is newBudgetedTeam with the model's engine settings.
func newBudgetedTeamWith(t *testing.T, perMinute int64, cold time.Duration, settings engine.Settings) budgetedTeam {
	t.Helper()
	e, agent, keys := realAgentWith(t, "admin-"+t.Name(), settings)
	g := startGateway(t, e, gateway.Config{APIKeysFile: keys, TenantKeys: true, GatewayID: "gw-" + strings.ToLower(t.Name()),
		MetricsListener: loopback(t), ColdStartTimeout: cold})
	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	mac := "mac-" + f.ns
	f.node(mac, metav1.ConditionTrue)
	f.deployment("tiny", "", 1)
	f.replica("tiny-0", "tiny", mac)
	f.setReplica("tiny-0", metav1.ConditionTrue, agent)
	key := "team-key-" + f.ns
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "ci"}, Type: tenancy.SecretType,
		Data: map[string][]byte{tenancy.KeyField: []byte(key)}}
	if err := e.Client.Create(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	f.cleanup(s)
	b := &mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "team"},
		Spec: mfv1.TokenBudgetSpec{TokensPerMinute: ptr.To(perMinute)}}
	if err := e.Client.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	f.cleanup(b)
	g.key = key
	waitModel(t, g, "tiny", f.ns, 1)
	oc := openai.NewClient(option.WithBaseURL(g.url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	return budgetedTeam{g: g, f: f, key: key, oc: oc, e: e, keys: keys}
}

// chat is a chat completion of tiny capped at maxTokens.
func chat(maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: "tiny", MaxTokens: openai.Int(maxTokens), Temperature: openai.Float(0),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello there")}}
}

// minuteStart waits for the first 15 s of a UTC minute and returns its start.
func minuteStart(t *testing.T) time.Time {
	t.Helper()
	testenv.Eventually(t, 70*time.Second, 50*time.Millisecond, func() (bool, string) {
		return time.Now().UTC().Second() < 15, "waiting for a minute's first 15 s"
	})
	return time.Now().UTC().Truncate(time.Minute)
}

// TestAttackBudgetConcurrency: team-a, with a TokenBudget of 200 tokens a minute,
// sends 12 chat completions of max_tokens 120 at once at the start of a minute,
// through the gateway to a real runner. Before reservations all 12 were admitted
// (usage was charged only when an answer ended) and ~1,700 tokens served, 8× the
// budget. Now each request reserves its prompt's estimate plus its max_tokens: the
// tokens served in the minute (the answers' usage) stay within the 200 (the bound,
// as no prompt here uses more than its estimate), at least one answer is served, and
// the others are refused with the budget's 429 and a Retry-After.
func TestAttackBudgetConcurrency(t *testing.T) {
	const limit, requests, maxTokens = 200, 12, 120
	tm := newBudgetedTeam(t, limit, 30*time.Second)
	// The series is the process's: other tests' refusals count in it too.
	const series = `macfleet_gateway_budget_admissions_total{outcome="budget_exceeded"}`
	before := metricValue(t, tm.g, series)
	served, tokens, refused := burst(t, []openai.Client{tm.oc}, requests, maxTokens)
	t.Logf("%d requests of max_tokens %d at once: %d served using %d tokens, %d refused, against %d tokens a minute",
		requests, maxTokens, served, tokens, refused, limit)
	if served == 0 || tokens > limit || served+int64(refused) != requests {
		t.Errorf("%d served using %d tokens and %d refused of %d: want at least one served and at most %d tokens",
			served, tokens, refused, requests, limit)
	}
	if got := metricValue(t, tm.g, series) - before; got != float64(refused) {
		t.Errorf("metric %s grew by %v, want %d refusals", series, got, refused)
	}
}

// TestAttackBudgetTwoGateways: the same burst split over two gateway replicas
// sharing the API server, all at once at the start of a minute. Before leases each
// replica admitted one request against the whole limit before it read the other's
// reservation (published every 200 ms), and both were served: ~290 tokens of 200.
// Now, with both replicas live, each admits only within the tokens it leased with a
// conditional write on the TokenBudget's status: the tokens served stay within 110 %
// of the limit (within it, as no prompt here uses more than its estimate), at least
// one answer is served, and the rest are refused with the budget's 429.
func TestAttackBudgetTwoGateways(t *testing.T) {
	const limit, requests, maxTokens = 200, 12, 120
	tm := newBudgetedTeam(t, limit, 30*time.Second)
	g2 := startGateway(t, tm.e, gateway.Config{APIKeysFile: tm.keys, TenantKeys: true,
		GatewayID: "gw2-" + strings.ToLower(t.Name()), ColdStartTimeout: 30 * time.Second})
	g2.key = tm.key
	waitModel(t, g2, "tiny", tm.f.ns, 1)
	oc2 := openai.NewClient(option.WithBaseURL(g2.url+"/v1/"), option.WithAPIKey(tm.key), option.WithMaxRetries(0))
	waitBothLive(t, tm)
	served, tokens, refused := burst(t, []openai.Client{tm.oc, oc2}, requests, maxTokens)
	t.Logf("%d requests of max_tokens %d at once over two gateways: %d served using %d tokens, %d refused, against %d a minute",
		requests, maxTokens, served, tokens, refused, limit)
	if served == 0 || tokens*100 > limit*110 {
		t.Errorf("%d served using %d tokens (%d %%) and %d refused: want at least one served and at most 110 %% of %d",
			served, tokens, tokens*100/limit, refused, limit)
	}
}

// burst sends requests chat completions of maxTokens at once at the start of a
// minute, request i through clients[i % len(clients)], and returns how many were
// served and the tokens they used, and how many were refused with the budget's 429
// and a Retry-After. Anything else fails t, and so does a burst that ran into the
// next minute (the budget reset under it).
func burst(t *testing.T, clients []openai.Client, requests int, maxTokens int64) (served, tokens int64, refused int) {
	t.Helper()
	minute := minuteStart(t)
	served, tokens, refused = atOnce(t, requests, func(ctx context.Context, i int) (int64, error) {
		var raw *http.Response
		resp, err := clients[i%len(clients)].Chat.Completions.New(ctx, chat(maxTokens), option.WithResponseInto(&raw))
		if err != nil && (raw == nil || raw.Header.Get("Retry-After") == "") {
			return 0, fmt.Errorf("%w (no Retry-After)", err)
		}
		if err != nil {
			return 0, err
		}
		return resp.Usage.TotalTokens, nil
	})
	inMinute(t, minute)
	return served, tokens, refused
}

// atOnce runs send for requests 0..requests-1 at once (within 40 s) and returns how
// many were served and the tokens they used, and how many were refused with the
// budget's 429 (token_budget_exceeded). Any other error fails t.
func atOnce(t *testing.T, requests int, send func(ctx context.Context, i int) (int64, error)) (served, tokens int64, refused int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for i := range requests {
		wg.Go(func() {
			<-start
			n, err := send(ctx, i)
			mu.Lock()
			defer mu.Unlock()
			var apiErr *openai.Error
			switch {
			case err == nil:
				served++
				tokens += n
			case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusTooManyRequests && apiErr.Code == "token_budget_exceeded":
				refused++
			default:
				t.Errorf("a request: %v, want an answer or the budget's 429", err)
			}
		})
	}
	close(start)
	wg.Wait()
	return served, tokens, refused
}

// inMinute fails t when the minute that started at minute is over: a budget's
// window reset under what the test sent in it.
func inMinute(t *testing.T, minute time.Time) {
	t.Helper()
	if end := time.Now().UTC().Truncate(time.Minute); !end.Equal(minute) {
		t.Fatalf("the requests (from %v) ran into the next minute: the budget reset under them", minute)
	}
}

// waitBothLive waits, up to 10 s, until each of the two gateways renewed a usage
// record within the last 5 s: each then counts the other live. A gateway that
// publishes no heartbeat leaves it to time out, and the burst goes on regardless.
func waitBothLive(t *testing.T, tm budgetedTeam) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var l mfv1.TokenUsageList
		if err := tm.e.Client.List(t.Context(), &l); err != nil {
			t.Fatal(err)
		}
		live := map[string]bool{}
		for _, tu := range l.Items {
			if tu.Spec.RenewTime != nil && time.Since(tu.Spec.RenewTime.Time) < 5*time.Second {
				live[tu.Spec.Gateway] = true
			}
		}
		if live["gw-"+strings.ToLower(t.Name())] && live["gw2-"+strings.ToLower(t.Name())] {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the two gateways did not both renew a usage record within 10 s")
}

// TestBudgetReservationReleased: requests that end without an answer, by an error
// (a replica that cannot be reached, until the gateway's cold start timeout) or by
// their client going away while the gateway holds them, give their reservation back,
// and so does a stream from the real runner whose client goes away after its first
// chunk, settled to what was generated. Each reserves 3/4 of the minute's budget,
// so a leak refuses the next one; after all of them the reserved tokens' gauge reads
// 0 and a request asking exactly what the stream left of the budget is served.
func TestBudgetReservationReleased(t *testing.T) {
	const limit = 200
	tm := newBudgetedTeam(t, limit, 2*time.Second)
	mac := "mac-" + tm.f.ns
	tm.f.deployment("dead", "", 1)
	tm.f.replica("dead-0", "dead", mac)
	ln := loopback(t)
	ln.Close() // a port nobody listens on
	tm.f.setReplica("dead-0", metav1.ConditionTrue, ln.Addr().String())
	tm.f.deployment("held", "", 1)
	tm.f.replica("held-0", "held", mac)
	tm.f.setReplica("held-0", metav1.ConditionFalse, "")
	waitModel(t, tm.g, "dead", tm.f.ns, 1)
	waitModel(t, tm.g, "held", tm.f.ns, 0)

	body := func(model string) string { // ask: 85 bytes / 2 + 1 + 100 = 143 tokens
		return `{"model":"` + model + `","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	}
	for i := range 4 {
		code, b := send(http.MethodPost, tm.g.url+"/v1/chat/completions", body("dead"), tm.key)
		if code != http.StatusServiceUnavailable {
			t.Fatalf("request %d to an unreachable replica: %d %s, want its 503 (a 429 is a leaked reservation)", i, code, b)
		}
	}
	for i := range 4 {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, tm.g.url+"/v1/chat/completions", strings.NewReader(body("held")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tm.key)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			t.Fatalf("request %d held for a replica: %d, want it held until its client goes away (a 429 is a leaked reservation)", i, resp.StatusCode)
		}
		// The gateway learns that the client went away when it reads the closed
		// connection, a moment after the client has already moved on: the
		// reservation must be given back then, and never kept.
		waitReserved(t, tm.g, 0)
	}
	// A stream whose client goes away after its first chunk: its reservation is
	// settled to what the runner generated.
	ctx, cancel := context.WithCancel(t.Context())
	stream := tm.oc.Chat.Completions.NewStreaming(ctx, chat(100))
	if !stream.Next() {
		t.Fatalf("the stream to cancel: %v", stream.Err())
	}
	cancel()
	_ = stream.Close()
	waitReserved(t, tm.g, 0)
	used := int64(0)
	for _, typ := range []string{"input", "output"} {
		series := `macfleet_usage_tokens_total{deployment="` + tm.f.ns + `/tiny",key="ci",namespace="` + tm.f.ns + `",type="` + typ + `"}`
		n, err := strconv.ParseInt(strings.TrimPrefix(metricLine(t, tm.g, series), series+" "), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		used += n
	}
	// What is left of the minute, asked whole: the body's 76 or 77 bytes (max_tokens
	// of 2 or 3 digits) / 2 + 1 + max_tokens.
	maxTokens := limit - used - (76/2 + 1)
	if maxTokens < 10 {
		t.Fatalf("the cancelled stream used %d of %d tokens: nothing left to ask", used, limit)
	}
	final := fmt.Sprintf(`{"model":"tiny","max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)
	code, b := send(http.MethodPost, tm.g.url+"/v1/chat/completions", final, tm.key)
	if code != http.StatusOK {
		t.Errorf("after 9 requests that ended without an answer or were cancelled (%d tokens used), one asking the %d left: %d %s",
			used, limit-used, code, b)
	}
}

// waitReserved waits until the gateway's reserved tokens' gauge reads want.
func waitReserved(t *testing.T, g runningGateway, want int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		line := metricLine(t, g, "macfleet_gateway_budget_reserved_tokens ")
		return line == fmt.Sprintf("macfleet_gateway_budget_reserved_tokens %d", want), line
	})
}

// metricValue is the value of the series named by prefix (its name and labels) on
// g's metrics endpoint, 0 while it has none.
func metricValue(t *testing.T, g runningGateway, prefix string) float64 {
	t.Helper()
	code, body := get(g.metrics + "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	for l := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(l, prefix+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	return 0
}

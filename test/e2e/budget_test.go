package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/ledger"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// budgetFleet is one namespace with a deployment, served by gateways with the teams'
// keys, each with its own id (its usage records are its own).
func budgetFleet(t *testing.T, gateways int) (ns string, bases []string) {
	t.Helper()
	ns = testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "assistant", 1))
	for i := range gateways {
		base, _ := inProcessGateway(t, gateway.Config{TenantKeys: true, GatewayID: fmt.Sprintf("gw-%d-%s", i, ns)}, testr.New(t))
		bases = append(bases, base)
	}
	waitReady(t, ns, "assistant", 1, 3*time.Minute)
	return ns, bases
}

func createBudget(t *testing.T, ns, name string, spec v1alpha1.TokenBudgetSpec) {
	t.Helper()
	create(t, &v1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec})
}

// countBody is a short chat completion for the deployment.
func countBody(i, maxTokens int) string {
	return fmt.Sprintf(`{"model":"assistant","max_tokens":%d,"messages":[{"role":"user","content":"Count to %d."}]}`, maxTokens, i)
}

// firstRefusal posts until the gateway answers 429 (bounded), and returns that answer
// with the time just before and after it was asked.
func firstRefusal(t *testing.T, base, path, key string, body func(i int) string) (resp *http.Response, text string, before, after time.Time) {
	t.Helper()
	for i := range 200 {
		before = time.Now()
		resp = postWithKey(t, base, path, key, body(i))
		after = time.Now()
		b := readAll(t, resp)
		if resp.StatusCode == http.StatusTooManyRequests {
			return resp, b, before, after
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	t.Fatalf("200 requests and no 429 from %s", path)
	return nil, "", before, after
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// untilMinuteEnd is the whole seconds from at to the next UTC minute, as Retry-After
// counts them.
func untilMinuteEnd(at time.Time) int {
	d := at.Truncate(time.Minute).Add(time.Minute).Sub(at)
	return int((d + time.Second - 1) / time.Second)
}

// TestBudgetRefusesOverTheMinute: a key over its TokenBudget's tokensPerMinute, set
// with the API while the gateway runs, is answered 429 with Retry-After the seconds
// until the minute ends and an error naming the budget, in the OpenAI shape on chat
// completions and in the Anthropic shape on Messages; another key of the namespace
// is still served; and the gateway's usage record of the day holds what it counted.
func TestBudgetRefusesOverTheMinute(t *testing.T) {
	ns, bases := budgetFleet(t, 1)
	base := bases[0]
	ci, app := newKey(t), newKey(t)
	createKey(t, ns, "ci", ci)
	createKey(t, ns, "app", app)
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		code, body := rawPost(t, base, "/v1/chat/completions", ci, countBody(0, 4))
		return code == http.StatusOK, fmt.Sprintf("the key's first request: %d %s", code, body)
	})
	createBudget(t, ns, "ci-minute", v1alpha1.TokenBudgetSpec{Key: "ci", TokensPerMinute: ptr.To[int64](60)})

	resp, body, before, after := firstRefusal(t, base, "/v1/chat/completions", ci, func(i int) string { return countBody(i, 8) })
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < untilMinuteEnd(after) || ra > untilMinuteEnd(before) {
		t.Errorf("Retry-After %q, want between %d and %d s (the minute's end)", resp.Header.Get("Retry-After"),
			untilMinuteEnd(after), untilMinuteEnd(before))
	}
	var oe struct {
		Error struct{ Type, Code, Message string }
	}
	if err := json.Unmarshal([]byte(body), &oe); err != nil {
		t.Fatalf("the 429's body %q: %v", body, err)
	}
	reset := before.UTC().Truncate(time.Minute).Add(time.Minute).Format(time.RFC3339)
	if oe.Error.Type != "rate_limit_error" || oe.Error.Code != "token_budget_exceeded" ||
		!strings.Contains(oe.Error.Message, "TokenBudget "+ns+"/ci-minute allows 60 tokens per minute") ||
		(!strings.Contains(oe.Error.Message, "resets at "+reset) && untilMinuteEnd(after) == untilMinuteEnd(before)) {
		t.Errorf("the 429's body: %s", body)
	}

	// Messages: the same refusal, in the Anthropic shape (within the same minute
	// unless it just ended).
	mresp, mbody, _, _ := firstRefusal(t, base, "/v1/messages", ci, func(i int) string {
		return fmt.Sprintf(`{"model":"assistant","max_tokens":4,"messages":[{"role":"user","content":"Hi %d"}]}`, i)
	})
	var ae struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal([]byte(mbody), &ae); err != nil || ae.Type != "error" || ae.Error.Type != "rate_limit_error" ||
		!strings.Contains(ae.Error.Message, "TokenBudget "+ns+"/ci-minute") || mresp.Header.Get("Retry-After") == "" {
		t.Errorf("the Messages 429: %s (Retry-After %q)", mbody, mresp.Header.Get("Retry-After"))
	}
	// The other key has no budget of its own and the namespace none.
	if code, b := rawPost(t, base, "/v1/chat/completions", app, countBody(1, 4)); code != http.StatusOK {
		t.Errorf("another key of the namespace: %d %s", code, b)
	}

	// The ledger: the gateway's record of the day counts both keys.
	name := ledger.RecordName("gw-0-"+ns, time.Now())
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		var tu v1alpha1.TokenUsage
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &tu); err != nil {
			return false, err.Error()
		}
		keys := map[string]int64{}
		for _, u := range tu.Spec.Usage {
			if u.Deployment != ns+"/assistant" {
				return false, fmt.Sprintf("usage of deployment %q", u.Deployment)
			}
			keys[u.Key] += u.Requests
		}
		// ci: its request before the budget; a budget's admission reserves a request's
		// most tokens, so under 60 a minute none fits beside the 33 already used.
		return keys["ci"] >= 1 && keys["app"] >= 1 && tu.Spec.Gateway == "gw-0-"+ns && tu.Spec.RenewTime != nil,
			fmt.Sprintf("record %s: %+v", name, tu.Spec)
	})
}

// usageTokens is a chat completion's prompt plus completion tokens.
func usageTokens(t *testing.T, body string) int64 {
	var r struct {
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.Usage.PromptTokens == 0 {
		t.Errorf("no usage in %q: %v", body, err)
	}
	return r.Usage.PromptTokens + r.Usage.CompletionTokens
}

// TestBudgetHoldsAcrossTwoGateways splits a bounded load over two gateway replicas
// that share the API server, each counting its own and reading the other's usage
// record, against a namespace's tokensPerMinute, until every client is refused. The
// tokens admitted in the minute (what the responses' usage adds up to) reach the
// budget, less what the requests in flight reserved when the last were refused
// (under 1 %), and stay within 10 % over it.
func TestBudgetHoldsAcrossTwoGateways(t *testing.T) {
	const limit, workers = 40000, 3 // workers per gateway
	ns, bases := budgetFleet(t, 2)
	key := newKey(t)
	createKey(t, ns, "load", key)
	for _, base := range bases {
		testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
			code, body := rawPost(t, base, "/v1/chat/completions", key, countBody(0, 4))
			return code == http.StatusOK, fmt.Sprintf("the key's first request: %d %s", code, body)
		})
	}
	createBudget(t, ns, "team", v1alpha1.TokenBudgetSpec{TokensPerMinute: ptr.To[int64](limit)})
	// Both gateways have read the budgets once each refuses a key whose budget, made
	// after the namespace's, is zero.
	createBudget(t, ns, "probe", v1alpha1.TokenBudgetSpec{Key: "probe", TokensPerMinute: ptr.To[int64](0)})
	probe := newKey(t)
	createKey(t, ns, "probe", probe)
	for _, base := range bases {
		testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
			code, body := rawPost(t, base, "/v1/chat/completions", probe, countBody(0, 1))
			return code == http.StatusTooManyRequests, fmt.Sprintf("a probe of a zero budget: %d %s", code, body)
		})
	}
	// The load runs within one UTC minute of its own (the requests above counted in
	// theirs): it starts in the first 15 s of the next one.
	warm := time.Now().UTC().Truncate(time.Minute)
	testenv.Eventually(t, 80*time.Second, 100*time.Millisecond, func() (bool, string) {
		now := time.Now().UTC()
		return now.Truncate(time.Minute).After(warm) && now.Second() < 15, fmt.Sprintf("it is %v", now)
	})
	minute := time.Now().UTC().Truncate(time.Minute)
	var (
		mu       sync.Mutex
		admitted [2]int64
		requests [2]int
		lastEnd  time.Time
	)
	var wg sync.WaitGroup
	started := time.Now()
	for g, base := range bases {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 1000 {
					code, body := rawPost(t, base, "/v1/chat/completions", key, countBody(g*10000+w*1000+i, 16))
					if code == http.StatusTooManyRequests {
						return
					}
					if code != http.StatusOK {
						t.Errorf("gateway %d: %d %s", g, code, body)
						return
					}
					n := usageTokens(t, body)
					mu.Lock()
					admitted[g] += n
					requests[g]++
					lastEnd = time.Now()
					mu.Unlock()
				}
				t.Errorf("gateway %d worker %d: 1000 requests and no 429", g, w)
			}()
		}
	}
	wg.Wait()
	if end := time.Now().UTC().Truncate(time.Minute); !end.Equal(minute) || lastEnd.UTC().Truncate(time.Minute) != minute {
		t.Fatalf("the load (started %v) ran past its minute %v: the budget reset under it", started, minute)
	}
	total := admitted[0] + admitted[1]
	over := float64(total-limit) / limit * 100
	t.Logf("admitted %d tokens (gateway 0: %d in %d requests, gateway 1: %d in %d) against %d per minute in %v: %+.1f %%",
		total, admitted[0], requests[0], admitted[1], requests[1], limit, time.Since(started).Round(time.Millisecond), over)
	if over < -1 || over > 10 {
		t.Errorf("admitted %d tokens against a budget of %d per minute (%+.1f %%), want within [-1, +10 %%]", total, limit, over)
	}
	if requests[0] == 0 || requests[1] == 0 {
		t.Errorf("the load was not split: %v requests", requests)
	}
}

// TestBudgetSDKsRetryAfterTheReset: the official openai and Anthropic npm clients,
// with their own retries, meet a key's exhausted minute: each is answered 429, waits
// the Retry-After the gateway sends and is served once the minute resets.
func TestBudgetSDKsRetryAfterTheReset(t *testing.T) {
	if _, err := os.Stat(nodeModules() + "/@anthropic-ai/sdk"); err != nil && os.Getenv("CI") == "" {
		t.Skipf("the @anthropic-ai/sdk npm package is missing in %s; hack/deps.sh test installs it", nodeModules())
	}
	ns, bases := budgetFleet(t, 1)
	base := bases[0]
	keys := map[string]string{"openai": newKey(t), "anthropic": newKey(t)}
	for sdk, key := range keys {
		createKey(t, ns, sdk, key)
		createBudget(t, ns, sdk, v1alpha1.TokenBudgetSpec{Key: sdk, TokensPerMinute: ptr.To[int64](20)})
	}
	// A Retry-After of 60 s is past what the clients wait for: exhaust the keys after
	// a minute's first seconds.
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		s := time.Now().UTC().Second()
		return s >= 3 && s < 50, fmt.Sprintf("second %d of the minute", s)
	})
	for sdk, key := range keys {
		testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
			code, body := rawPost(t, base, "/v1/chat/completions", key, countBody(0, 8))
			return code == http.StatusTooManyRequests, fmt.Sprintf("%s's key: %d %s", sdk, code, body)
		})
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(keys))
	for sdk, key := range keys {
		cmd := nodeScript(t, "budget-sdks.cjs", base+"/v1", key, "assistant", "SDK="+sdk, "ANTHROPIC_BASE_URL="+base)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runNode(t, cmd); err != nil {
				errs <- fmt.Errorf("the %s client: %w", sdk, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestBudgetCapsAnAskOverTheRoom: a Responses request without max_output_tokens and
// an Anthropic message of max_tokens 4096, each from a key with a TokenBudget of 300
// tokens a minute (its ask, a slot of the 512-token context or 4,096, is over it), are
// served through the gateway capped to what the minute leaves: the answer names the
// field and the cap in X-Macfleet-Budget-Capped, the agent stopped there (Responses:
// status incomplete, Messages: stop_reason max_tokens) and the usage stays within 110 %
// of the 300 (the budget's bound: the limit, plus what a prompt uses beyond its
// estimate, the body's bytes over 2; the test model's small vocabulary merges little).
// Both are greedy: a sampled answer of the random test model may reach its end of
// turn before the cap, which would show nothing about the cap.
func TestBudgetCapsAnAskOverTheRoom(t *testing.T) {
	const limit = 300
	ns, bases := budgetFleet(t, 1)
	base := bases[0]
	keys := map[string]string{"responses": newKey(t), "messages": newKey(t), "probe": newKey(t)}
	// The probe's key last: the gateway that knows it knows the others (a map's order
	// once made it first, and the others' requests were refused as unknown keys).
	for _, name := range []string{"responses", "messages", "probe"} {
		createKey(t, ns, name, keys[name])
	}
	createBudget(t, ns, "responses", v1alpha1.TokenBudgetSpec{Key: "responses", TokensPerMinute: ptr.To[int64](limit)})
	createBudget(t, ns, "messages", v1alpha1.TokenBudgetSpec{Key: "messages", TokensPerMinute: ptr.To[int64](limit)})
	createBudget(t, ns, "probe", v1alpha1.TokenBudgetSpec{Key: "probe", TokensPerMinute: ptr.To[int64](0)})
	// The gateway has read the budgets once it refuses the probe's, made last.
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		code, body := rawPost(t, base, "/v1/chat/completions", keys["probe"], countBody(0, 1))
		return code == http.StatusTooManyRequests, fmt.Sprintf("a probe of a zero budget: %d %s", code, body)
	})
	for _, tc := range []struct {
		path, key, body, field, stop string
		usage                        func(body string) (int64, string)
	}{
		{path: "/v1/responses", key: keys["responses"], field: "max_output_tokens", stop: "incomplete", body: `{"model":"assistant","temperature":0,"input":"Tell me about the sea."}`,
			usage: func(b string) (int64, string) {
				var r struct {
					Status string
					Usage  struct {
						TotalTokens int64 `json:"total_tokens"`
					}
				}
				_ = json.Unmarshal([]byte(b), &r)
				return r.Usage.TotalTokens, r.Status
			}},
		{path: "/v1/messages", key: keys["messages"], field: "max_tokens", stop: "max_tokens",
			body: `{"model":"assistant","max_tokens":4096,"temperature":0,"messages":[{"role":"user","content":"Tell me about the sea."}]}`,
			usage: func(b string) (int64, string) {
				var r struct {
					StopReason string `json:"stop_reason"`
					Usage      struct {
						InputTokens  int64 `json:"input_tokens"`
						OutputTokens int64 `json:"output_tokens"`
					}
				}
				_ = json.Unmarshal([]byte(b), &r)
				return r.Usage.InputTokens + r.Usage.OutputTokens, r.StopReason
			}},
	} {
		resp := postWithKey(t, base, tc.path, tc.key, tc.body)
		body := readAll(t, resp)
		capped := resp.Header.Get(gateway.HeaderBudgetCapped)
		used, end := tc.usage(body)
		t.Logf("%s: %d, %s %q, %d tokens, ended %q", tc.path, resp.StatusCode, gateway.HeaderBudgetCapped, capped, used, end)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(capped, tc.field+"=") || used == 0 || used*100 > limit*110 ||
			end != tc.stop {
			t.Errorf("%s over the room: %d, %s %q, %d tokens, ended %q: want served, capped in %s, stopped by it (%q), "+
				"within 110 %% of %d tokens (%s)", tc.path, resp.StatusCode, gateway.HeaderBudgetCapped, capped, used, end,
				tc.field, tc.stop, limit, body)
		}
	}
}

package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/gateway"
)

// manyChoices is a chat completion of tiny with n choices and no max_tokens: each
// choice is bounded only by the context.
func manyChoices(n int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: "tiny", N: openai.Int(n), Temperature: openai.Float(0),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello there")}}
}

// capOfHeader is the cap HeaderBudgetCapped reports for a request that set no
// max_tokens ("max_tokens=N; asked=none"); 0 when h does not say that.
func capOfHeader(h string) int64 {
	v, ok := strings.CutPrefix(h, "max_tokens=")
	if !ok {
		return 0
	}
	v, ok = strings.CutSuffix(v, "; asked=none")
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// TestAttackBudgetAskOverTheWindow: team-a, with a TokenBudget of 200 tokens a minute,
// sends one chat completion with n: 16 and no max_tokens at the start of a minute,
// through the gateway to a real runner. Its ask (the prompt's estimate plus 16 slots
// of the 1,024-token context, ~24,600 tokens) is over the whole limit; on main it was
// admitted into the empty window and served 16 choices of up to the context, many
// times the budget, in every window. Now the gateway caps each choice's max_tokens to
// what the window leaves ((200 − the prompt's estimate) / 16) and says so in
// X-Macfleet-Budget-Capped: the answer has its 16 choices, each within the cap, and
// uses at most the 200 tokens.
func TestAttackBudgetAskOverTheWindow(t *testing.T) {
	const limit, n = 200, 16
	tm := newBudgetedTeamWith(t, limit, 30*time.Second, engine.Settings{ContextLength: 1024, Parallel: n})
	const series = `macfleet_gateway_budget_admissions_total{outcome="capped"}`
	before := metricValue(t, tm.g, series)
	minute := minuteStart(t)
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	var raw *http.Response
	resp, err := tm.oc.Chat.Completions.New(ctx, manyChoices(n), option.WithResponseInto(&raw))
	if err != nil {
		var apiErr *openai.Error
		if errors.As(err, &apiErr) {
			t.Fatalf("n: %d without max_tokens: %v: %s", n, err, apiErr.RawJSON())
		}
		t.Fatalf("n: %d without max_tokens: %v", n, err)
	}
	inMinute(t, minute)
	capped := capOfHeader(raw.Header.Get(gateway.HeaderBudgetCapped))
	t.Logf("n: %d without max_tokens against %d tokens a minute: %d choices, %d prompt + %d completion tokens; %s: %q",
		n, limit, len(resp.Choices), resp.Usage.PromptTokens, resp.Usage.CompletionTokens, gateway.HeaderBudgetCapped,
		raw.Header.Get(gateway.HeaderBudgetCapped))
	if resp.Usage.TotalTokens > limit {
		t.Errorf("one request used %d tokens of a budget of %d a minute", resp.Usage.TotalTokens, limit)
	}
	if capped < 1 || capped*n > limit {
		t.Errorf("%s %q: want max_tokens=N; asked=none with 1 ≤ N ≤ %d", gateway.HeaderBudgetCapped,
			raw.Header.Get(gateway.HeaderBudgetCapped), limit/n)
	}
	if len(resp.Choices) != n {
		t.Errorf("%d choices, want %d", len(resp.Choices), n)
	}
	if capped > 0 && resp.Usage.CompletionTokens > capped*n {
		t.Errorf("%d completion tokens over %d choices capped at %d", resp.Usage.CompletionTokens, n, capped)
	}
	if got := metricValue(t, tm.g, series) - before; got != 1 {
		t.Errorf("metric %s grew by %v, want 1", series, got)
	}
}

// TestBudgetCapsABurstOverTwoGateways: the burst of issue 55 against 200 tokens a
// minute, at once at a minute's start, split over two gateway replicas that share
// the API server: one chat completion of n: 16 without max_tokens and 50 streams of
// n: 4 without max_tokens. The tokens served in the minute (the answers' usage) stay
// within 110 % of the limit, and at least one request is served.
func TestBudgetCapsABurstOverTwoGateways(t *testing.T) {
	const limit, streams = 200, 50
	tm := newBudgetedTeamWith(t, limit, 30*time.Second, engine.Settings{ContextLength: 1024, Parallel: 16})
	g2 := startGateway(t, tm.e, gateway.Config{APIKeysFile: tm.keys, TenantKeys: true,
		GatewayID: "gw2-" + strings.ToLower(t.Name()), ColdStartTimeout: 30 * time.Second})
	g2.key = tm.key
	waitModel(t, g2, "tiny", tm.f.ns, 1)
	clients := []openai.Client{tm.oc, openai.NewClient(option.WithBaseURL(g2.url+"/v1/"), option.WithAPIKey(tm.key),
		option.WithMaxRetries(0))}
	waitBothLive(t, tm)
	stream := manyChoices(4)
	stream.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	minute := minuteStart(t)
	var capped atomic.Int64
	served, tokens, refused := atOnce(t, streams+1, func(ctx context.Context, i int) (int64, error) {
		c := clients[i%len(clients)]
		if i == 0 {
			var raw *http.Response
			resp, err := c.Chat.Completions.New(ctx, manyChoices(16), option.WithResponseInto(&raw))
			if err != nil {
				return 0, err
			}
			if raw.Header.Get(gateway.HeaderBudgetCapped) != "" {
				capped.Add(1)
			}
			return resp.Usage.TotalTokens, nil
		}
		var raw *http.Response
		s := c.Chat.Completions.NewStreaming(ctx, stream, option.WithResponseInto(&raw))
		defer s.Close()
		var used int64
		for s.Next() {
			used = max(used, s.Current().Usage.TotalTokens)
		}
		if err := s.Err(); err != nil {
			return 0, err
		}
		if raw != nil && raw.Header.Get(gateway.HeaderBudgetCapped) != "" {
			capped.Add(1)
		}
		return used, nil
	})
	inMinute(t, minute)
	t.Logf("n: 16 and %d streams of n: 4, none with max_tokens, over two gateways against %d tokens a minute: "+
		"%d served (%d capped) using %d tokens (%.2f× the limit), %d refused", streams, limit, served, capped.Load(), tokens,
		float64(tokens)/limit, refused)
	if served == 0 || tokens*100 > limit*110 {
		t.Errorf("%d served using %d tokens (%d %%): want at least one served and at most 110 %% of %d",
			served, tokens, tokens*100/limit, limit)
	}
}

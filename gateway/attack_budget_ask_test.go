package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/gateway"
)

// TestAttackBudgetAskOverTheWindow: team-a, with a TokenBudget of 200 tokens a
// minute over two gateway replicas, sends one stream of n: 16 without max_tokens at
// the start of a minute (it asks 16 × the deployment's context), then 50 streams of
// n: 4 at once. Before, an ask over the whole limit was admitted whenever the window
// was empty (`need := min(ask, limit)`), and the n: 16 stream was served thousands
// of tokens against the 200 (seen: it passed 400 tokens and was cut by the test).
// Now it is refused with the budget's 429 naming the ask and the room, whatever the
// wait; and the tokens served in the minute, across both gateways, stay within
// 110 % of the limit.
func TestAttackBudgetAskOverTheWindow(t *testing.T) {
	const limit, streams = 200, 50
	tm := newBudgetedTeamWith(t, limit, 30*time.Second, engine.Settings{ContextLength: 1024, Parallel: 16})
	g2 := startGateway(t, tm.e, gateway.Config{APIKeysFile: tm.keys, TenantKeys: true,
		GatewayID: "gw2-" + strings.ToLower(t.Name()), ColdStartTimeout: 30 * time.Second})
	g2.key = tm.key
	waitModel(t, g2, "tiny", tm.f.ns, 1)
	oc2 := openai.NewClient(option.WithBaseURL(g2.url+"/v1/"), option.WithAPIKey(tm.key), option.WithMaxRetries(0))
	waitBothLive(t, tm)
	minute := minuteStart(t)
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	big := openai.ChatCompletionNewParams{Model: "tiny", N: openai.Int(16), Temperature: openai.Float(1),
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Write a long story")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}}
	bigTokens, bigErr := streamTokens(ctx, oc2, big, 2*limit)
	var apiErr *openai.Error
	switch {
	case bigErr == nil:
		t.Errorf("the n: 16 stream without max_tokens was served %d tokens against %d a minute, want the budget's 429", bigTokens, limit)
	case !errors.As(bigErr, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "token_budget_exceeded":
		t.Errorf("the n: 16 stream: %v, want the budget's 429", bigErr)
	case !strings.Contains(apiErr.Message, "whatever the wait") || !strings.Contains(apiErr.Message, "room left now is"):
		t.Errorf("the n: 16 stream's 429 says %q, want the ask, the room and that no wait helps", apiErr.Message)
	}

	served, tokens, refused := atOnce(t, streams, func(ctx context.Context, i int) (int64, error) {
		p := chat(8)
		p.N = openai.Int(4)
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		return streamTokens(ctx, []openai.Client{tm.oc, oc2}[i%2], p, 0)
	})
	tokens += bigTokens
	inMinute(t, minute)
	t.Logf("n: 16 without max_tokens: %d tokens (%v); %d streams of n: 4: %d served, %d refused; %d tokens in all against %d a minute",
		bigTokens, bigErr, streams, served, refused, tokens, limit)
	if served == 0 || tokens*100 > limit*110 {
		t.Errorf("%d streams served, %d tokens in the minute (%d %%): want at least one served and at most 110 %% of %d",
			served, tokens, tokens*100/limit, limit)
	}
}

// streamTokens streams p through oc and returns the tokens its usage reports; with
// cut > 0, a stream that has sent more than cut content chunks (a token of one
// choice each) is ended there and counted at its chunks.
func streamTokens(ctx context.Context, oc openai.Client, p openai.ChatCompletionNewParams, cut int64) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := oc.Chat.Completions.NewStreaming(ctx, p)
	defer s.Close()
	var chunks, usage int64
	for s.Next() {
		c := s.Current()
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" {
				chunks++
			}
		}
		if c.Usage.TotalTokens > 0 {
			usage = c.Usage.TotalTokens
		}
		if cut > 0 && chunks > cut {
			return chunks, nil
		}
	}
	if err := s.Err(); err != nil {
		return chunks, err
	}
	return usage, nil
}

package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// TestLogprobsAndChoices: logprobs and top_logprobs describe exactly the tokens
// generated, on chat and text completions, whole and streamed; n choices are their
// own reproducible sequences, counted together in usage.
func TestLogprobsAndChoices(t *testing.T) {
	r := startReady(t, specModel(t, "llama31", testassets.Llama31Spec), "--parallel", "2")
	client := r.openAI()
	ctx := context.Background()
	body := func(n int, temperature float64, stream bool) string {
		return fmt.Sprintf(`{"model":"m","max_tokens":8,"n":%d,"seed":5,"temperature":%g,"logprobs":true,"top_logprobs":3,
			"stream":%v,"messages":[{"role":"user","content":"Count to ten."}]}`, n, temperature, stream)
	}
	checkEntries := func(what string, lps []openai.ChatCompletionTokenLogprob, content string, greedy bool) {
		t.Helper()
		var joined []byte
		for i, lp := range lps {
			if lp.Logprob > 0 || len(lp.TopLogprobs) != 3 {
				t.Fatalf("%s token %d: logprob %g with %d alternatives", what, i, lp.Logprob, len(lp.TopLogprobs))
			}
			for k := 1; k < 3; k++ {
				if lp.TopLogprobs[k].Logprob > lp.TopLogprobs[k-1].Logprob {
					t.Errorf("%s token %d: alternatives not sorted: %+v", what, i, lp.TopLogprobs)
				}
			}
			if lp.Logprob > lp.TopLogprobs[0].Logprob+1e-4 {
				t.Errorf("%s token %d: logprob %g above the most likely %g", what, i, lp.Logprob, lp.TopLogprobs[0].Logprob)
			}
			if greedy && (lp.TopLogprobs[0].Token != lp.Token || math.Abs(lp.TopLogprobs[0].Logprob-lp.Logprob) > 1e-5) {
				t.Errorf("%s token %d: greedy chose %q (%g), the most likely is %q (%g)", what, i, lp.Token, lp.Logprob,
					lp.TopLogprobs[0].Token, lp.TopLogprobs[0].Logprob)
			}
			for _, b := range lp.Bytes {
				joined = append(joined, byte(b))
			}
		}
		if utf8.Valid(joined) && string(joined) != content {
			t.Errorf("%s: the tokens spell %q, the content is %q", what, joined, content)
		}
	}

	c, err := client.Chat.Completions.New(ctx, chatParams(t, body(2, 1, false)))
	if err != nil {
		apiFatal(t, err)
	}
	if len(c.Choices) != 2 || c.Choices[0].Index != 0 || c.Choices[1].Index != 1 {
		t.Fatalf("choices %+v, want indexes 0 and 1", c.Choices)
	}
	tokens := 0
	for i, ch := range c.Choices {
		checkEntries(fmt.Sprintf("choice %d", i), ch.Logprobs.Content, ch.Message.Content, false)
		tokens += len(ch.Logprobs.Content)
		if ch.FinishReason == "stop" {
			tokens++ // the end-of-turn token has no entry
		}
	}
	if int64(tokens) != c.Usage.CompletionTokens {
		t.Errorf("usage counts %d completion tokens, the choices' logprobs %d", c.Usage.CompletionTokens, tokens)
	}
	if c.Choices[0].Message.Content == c.Choices[1].Message.Content {
		t.Errorf("both choices are %q: not their own sequences", c.Choices[0].Message.Content)
	}
	again, err := client.Chat.Completions.New(ctx, chatParams(t, body(2, 1, false)))
	if err != nil {
		apiFatal(t, err)
	}
	for i := range 2 {
		if a, b := again.Choices[i].Message.Content, c.Choices[i].Message.Content; a != b {
			t.Errorf("choice %d with the same seed: %q, then %q", i, b, a)
		}
	}

	greedy, err := client.Chat.Completions.New(ctx, chatParams(t, body(1, 0, false)))
	if err != nil {
		apiFatal(t, err)
	}
	checkEntries("greedy", greedy.Choices[0].Logprobs.Content, greedy.Choices[0].Message.Content, true)

	// Streamed: each chunk carries its tokens' logprobs; the SDK reassembles both choices.
	stream := client.Chat.Completions.NewStreaming(ctx, chatParams(t, body(2, 1, true)))
	acc := openai.ChatCompletionAccumulator{}
	streamed := map[int64][]openai.ChatCompletionTokenLogprob{}
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		for _, choice := range ch.Choices {
			streamed[choice.Index] = append(streamed[choice.Index], choice.Logprobs.Content...)
			// The role chunk carries none: a continued stream's is dropped, and its
			// logprobs would be lost with it.
			if choice.Delta.Role != "" && len(choice.Logprobs.Content) > 0 {
				t.Errorf("choice %d's role chunk carries %d logprobs", choice.Index, len(choice.Logprobs.Content))
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 2 {
		t.Fatalf("streamed %d choices, want 2", len(acc.Choices))
	}
	for i, ch := range acc.Choices {
		checkEntries(fmt.Sprintf("streamed choice %d", i), streamed[int64(i)], ch.Message.Content, false)
	}

	// Text completions: the legacy shape.
	var tc runnerapi.Completion
	if code := r.postJSON("/v1/completions", `{"model":"m","prompt":"Once upon","max_tokens":6,"temperature":0,"logprobs":2}`, &tc); code != http.StatusOK {
		t.Fatalf("completion: %d", code)
	}
	lp := tc.Choices[0].Logprobs
	if lp == nil || len(lp.Tokens) == 0 || len(lp.Tokens) != len(lp.TokenLogprobs) || len(lp.TopLogprobs) != len(lp.Tokens) ||
		len(lp.TextOffset) != len(lp.Tokens) || lp.TextOffset[0] != 0 {
		t.Fatalf("completion logprobs %+v", lp)
	}
	if utf8.ValidString(strings.Join(lp.Tokens, "")) && strings.Join(lp.Tokens, "") != tc.Choices[0].Text {
		t.Errorf("the tokens spell %q, the text is %q", strings.Join(lp.Tokens, ""), tc.Choices[0].Text)
	}
	for i, top := range lp.TopLogprobs {
		if len(top) == 0 || len(top) > 2 || top[lp.Tokens[i]] != lp.TokenLogprobs[i] {
			t.Errorf("token %d %q (%g): alternatives %v", i, lp.Tokens[i], lp.TokenLogprobs[i], top)
		}
	}

	for _, tc := range []struct{ body, param string }{
		{`{"model":"m","n":3,"messages":[{"role":"user","content":"x"}]}`, "n"},
		{`{"model":"m","top_logprobs":2,"messages":[{"role":"user","content":"x"}]}`, "top_logprobs"},
		{`{"model":"m","logprobs":true,"top_logprobs":21,"messages":[{"role":"user","content":"x"}]}`, "top_logprobs"},
	} {
		var e struct{ Error struct{ Param *string } }
		if code := r.postJSON("/v1/chat/completions", tc.body, &e); code != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != tc.param {
			t.Errorf("%s: %d %+v, want 400 naming %s", tc.body, code, e.Error, tc.param)
		}
	}
}

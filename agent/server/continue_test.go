package server_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// TestContinueHeaderReachesTheRunner: the agent passes runnerapi.HeaderContinue on, so
// a partial answer is continued: its prompt is the conversation before the answer (as
// many tokens as the same conversation without it) and max_tokens bounds the whole
// answer; without the header the partial answer is a closed turn before a new one. A
// value the runner does not know is its 400.
func TestContinueHeaderReachesTheRunner(t *testing.T) {
	const maxTokens = 40
	a := startAgent(t, agentOptions{})
	usage := func(body map[string]any, header ...string) runnerapi.Usage {
		t.Helper()
		resp, b := a.do(http.MethodPost, "/v1/chat/completions", body, header...)
		var out runnerapi.ChatCompletion
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil || out.Usage == nil {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return *out.Usage
	}
	plain := usage(chatBody("tiny", maxTokens, false))
	partial := chatBody("tiny", maxTokens, false)
	partial["messages"] = []map[string]string{{"role": "user", "content": "Say something."},
		{"role": "assistant", "content": "Something: one two"}}
	closed := usage(partial)
	open := usage(partial, runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage)
	if open.PromptTokens != plain.PromptTokens || open.CompletionTokens != maxTokens {
		t.Errorf("continued usage %+v, want the plain conversation's %d prompt tokens and %d completion tokens",
			open, plain.PromptTokens, maxTokens)
	}
	if closed.PromptTokens <= plain.PromptTokens+3 || closed.CompletionTokens != maxTokens {
		t.Errorf("without the header usage %+v, want the partial answer in the prompt (more than %d tokens)", closed, plain.PromptTokens+3)
	}
	resp, b := a.do(http.MethodPost, "/v1/chat/completions", partial, runnerapi.HeaderContinue, "next-turn")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), runnerapi.HeaderContinue) {
		t.Errorf("an unknown mode: %d %s, want the runner's 400", resp.StatusCode, b)
	}
}

// TestTokenCountsReachTheRunner: the agent passes runnerapi.HeaderContinuedTokens and
// runnerapi.HeaderTokenCounts on. A continued answer declared as continuedTokens long
// counts that many completion tokens and generates only the rest of max_tokens (its
// logprobs, one a token, say how many it generated), whatever the partial answer
// re-tokenizes into; a counted stream puts the choice's tokens so far before each
// event with output, the last count the tokens the answer generated. A declared count
// that is not a count is the runner's 400.
func TestTokenCountsReachTheRunner(t *testing.T) {
	const maxTokens, continuedTokens = 40, 30
	a := startAgent(t, agentOptions{})
	partial := chatBody("tiny", maxTokens, false)
	partial["logprobs"] = true
	partial["messages"] = []map[string]string{{"role": "user", "content": "Say something."},
		{"role": "assistant", "content": "Something: one two"}}
	resp, b := a.do(http.MethodPost, "/v1/chat/completions", partial, runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage,
		runnerapi.HeaderContinuedTokens, strconv.Itoa(continuedTokens))
	var out runnerapi.ChatCompletion
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil || out.Usage == nil || out.Choices[0].Logprobs == nil {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got := len(out.Choices[0].Logprobs.Content); out.Usage.CompletionTokens != maxTokens || got != maxTokens-continuedTokens {
		t.Errorf("usage %+v and %d tokens generated, want %d completion tokens of which %d generated",
			*out.Usage, got, maxTokens, maxTokens-continuedTokens)
	}
	// An answer the client has max_tokens of already is spent: it ends at once.
	resp, b = a.do(http.MethodPost, "/v1/chat/completions", partial, runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage,
		runnerapi.HeaderContinuedTokens, strconv.Itoa(maxTokens))
	out = runnerapi.ChatCompletion{}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil || out.Usage == nil || len(out.Choices) != 1 ||
		out.Choices[0].Message.Content == nil {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if c := out.Choices[0]; out.Usage.CompletionTokens != maxTokens || c.FinishReason != "length" ||
		c.Logprobs != nil && len(c.Logprobs.Content) != 0 || c.Message.Content != nil && *c.Message.Content != "" {
		t.Errorf("a spent answer: usage %+v, choice %+v, want %d completion tokens, none generated and finish reason length",
			*out.Usage, c, maxTokens)
	}
	spent := maps.Clone(partial)
	spent["stream"], spent["stream_options"] = true, map[string]any{"include_usage": true}
	resp, b = a.do(http.MethodPost, "/v1/chat/completions", spent, runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage,
		runnerapi.HeaderContinuedTokens, strconv.Itoa(maxTokens))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"finish_reason":"length"`) ||
		!strings.Contains(string(b), fmt.Sprintf(`"completion_tokens":%d`, maxTokens)) || regexp.MustCompile(`"content":"[^"]`).Match(b) {
		t.Errorf("a spent answer streamed: %d %s, want no content, finish reason length and %d completion tokens", resp.StatusCode, b, maxTokens)
	}
	resp, b = a.do(http.MethodPost, "/v1/chat/completions", partial, runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage,
		runnerapi.HeaderContinuedTokens, "-1")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), runnerapi.HeaderContinuedTokens) {
		t.Errorf("a negative count: %d %s, want the runner's 400", resp.StatusCode, b)
	}

	body := chatBody("tiny", maxTokens, true)
	body["stream_options"] = map[string]any{"include_usage": true}
	resp, b = a.do(http.MethodPost, "/v1/chat/completions", body, runnerapi.HeaderTokenCounts, runnerapi.TokenCountComments)
	checkCounted(t, "a chat", resp, b, true)
	resp, b = a.do(http.MethodPost, "/v1/completions", map[string]any{"model": "tiny", "prompt": "Once upon", "max_tokens": 8,
		"temperature": 0, "stream": true, "stream_options": map[string]any{"include_usage": true}},
		runnerapi.HeaderTokenCounts, runnerapi.TokenCountComments)
	checkCounted(t, "a text completion", resp, b, false)
}

// checkCounted checks a counted stream: a count line of choice 0 before each event
// with output, never going down, the last one the usage's completion tokens; and with
// prompt (a chat) the prompt's line before the first event, the usage's prompt and
// cached tokens.
func checkCounted(t *testing.T, what string, resp *http.Response, b []byte, prompt bool) {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", what, resp.StatusCode, b)
	}
	last, counted, outputs := -1, 0, 0
	var usage runnerapi.Usage
	var prompts []string // the prompt's lines, and the event each was on
	for i, ev := range slices.Collect(strings.SplitSeq(strings.TrimSpace(string(b)), "\n\n")) {
		if line, rest, ok := strings.Cut(ev, "\n"); ok && strings.HasPrefix(line, runnerapi.PromptCountComment+" ") {
			prompts = append(prompts, fmt.Sprintf("%s on event %d", line, i))
			ev = rest
		}
		comment, data, hasComment := strings.Cut(ev, "\n")
		if !hasComment {
			data = ev
		}
		var c struct {
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
				Delta        struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *runnerapi.Usage `json:"usage"`
		}
		if json.Unmarshal([]byte(strings.TrimPrefix(data, "data: ")), &c) == nil && c.Usage != nil {
			usage = *c.Usage
		}
		output := len(c.Choices) == 1 && (c.Choices[0].Delta.Content != "" || c.Choices[0].Text != "" || c.Choices[0].FinishReason != nil)
		if output {
			outputs++
		}
		if !hasComment {
			if output {
				t.Errorf("%s: an event with output and no count: %q", what, ev)
			}
			continue
		}
		n, err := strconv.Atoi(strings.TrimPrefix(comment, runnerapi.TokenCountComment+" 0 "))
		if err != nil || n < last {
			t.Errorf("%s: count %q after %d", what, comment, last)
		}
		last = n
		counted++
	}
	if counted == 0 || counted != outputs || last != usage.CompletionTokens {
		t.Errorf("%s: %d counted events of %d with output, the last count %d, usage %+v: want every one counted, the last the usage's",
			what, counted, outputs, last, usage)
	}
	var want []string
	if prompt {
		cached := 0
		if usage.PromptTokensDetails != nil {
			cached = usage.PromptTokensDetails.CachedTokens
		}
		want = []string{fmt.Sprintf("%s %d %d on event 0", runnerapi.PromptCountComment, usage.PromptTokens, cached)}
	}
	if !slices.Equal(prompts, want) {
		t.Errorf("%s: the prompt's lines %q, want %q (usage %+v)", what, prompts, want, usage)
	}
}

// TestSpeculationHeaderReachesTheRunner: the agent passes runnerapi.HeaderSpeculation
// on. The tiny model's greedy answer repeats itself, which prompt lookup drafts: with
// the header on the usage counts accepted drafts, with it off none, and the answer is
// the same text either way.
func TestSpeculationHeaderReachesTheRunner(t *testing.T) {
	a := startAgent(t, agentOptions{})
	answer := func(header ...string) (string, runnerapi.Usage) {
		t.Helper()
		body := chatBody("tiny", 200, false)
		body["temperature"] = 0
		resp, b := a.do(http.MethodPost, "/v1/chat/completions", body, header...)
		var out runnerapi.ChatCompletion
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil || out.Usage == nil || len(out.Choices) != 1 ||
			out.Choices[0].Message.Content == nil {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return *out.Choices[0].Message.Content, *out.Usage
	}
	onText, on := answer(runnerapi.HeaderSpeculation, runnerapi.SpeculationOn)
	t.Logf("on: %+v %+v", on, on.CompletionTokensDetails)
	offText, off := answer(runnerapi.HeaderSpeculation, runnerapi.SpeculationOff)
	if on.CompletionTokensDetails == nil || on.CompletionTokensDetails.AcceptedPredictionTokens == 0 {
		t.Errorf("speculation on: usage %+v, want accepted drafts counted", on)
	}
	if d := off.CompletionTokensDetails; d != nil && d.AcceptedPredictionTokens+d.RejectedPredictionTokens > 0 {
		t.Errorf("%s: off: usage details %+v, want no drafts", runnerapi.HeaderSpeculation, *d)
	}
	if onText != offText || on.CompletionTokens != off.CompletionTokens {
		t.Errorf("answers differ with speculation on (%d tokens) and off (%d tokens):\n%q\n%q",
			on.CompletionTokens, off.CompletionTokens, onText, offText)
	}
}

package server_test

import (
	"encoding/json"
	"net/http"
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

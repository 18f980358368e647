package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/internal/chat/compat"
)

// anthropicEvents parses an Anthropic event stream into its events' data, by name.
func anthropicEvents(t *testing.T, body []byte) map[string][]map[string]any {
	t.Helper()
	out := map[string][]map[string]any{}
	for _, ev := range strings.Split(string(body), "\n\n") {
		var name string
		for _, line := range strings.Split(ev, "\n") {
			if n, ok := strings.CutPrefix(line, "event: "); ok {
				name = n
			}
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				var m map[string]any
				if err := json.Unmarshal([]byte(d), &m); err != nil {
					t.Fatalf("event %s: %v", name, err)
				}
				out[name] = append(out[name], m)
			}
		}
	}
	return out
}

// TestAnthropicUsageThroughTheAgent: through the agent's real handlers and a real
// runner, message_start reports the prompt's size before any content (input tokens
// plus the tokens read from the prompt cache), the same as message_delta and as
// count_tokens; a second request with the same prefix reads it from the cache; the
// hints are named in the response header (issue 28).
func TestAnthropicUsageThroughTheAgent(t *testing.T) {
	a := startAgent(t, agentOptions{})
	body := map[string]any{"model": "tiny", "max_tokens": 4, "stream": true, "temperature": 0,
		"system":             []map[string]any{{"type": "text", "text": "You are terse. Answer in one word.", "cache_control": map[string]any{"type": "ephemeral"}}},
		"context_management": map[string]any{"edits": []map[string]any{{"type": "clear_thinking_20251015", "keep": "all"}}},
		"messages":           []map[string]any{{"role": "user", "content": "Name a colour of the sky at noon, please."}}}
	prompt := func(u map[string]any) float64 {
		return u["input_tokens"].(float64) + u["cache_read_input_tokens"].(float64)
	}

	resp, b := a.do(http.MethodPost, "/v1/messages/count_tokens", body)
	var count struct {
		InputTokens float64 `json:"input_tokens"`
	}
	if err := json.Unmarshal(b, &count); resp.StatusCode != http.StatusOK || err != nil || count.InputTokens <= 0 {
		t.Fatalf("count_tokens: %d %s", resp.StatusCode, b)
	}

	var cachedSecond float64
	for i := range 2 {
		resp, b := a.do(http.MethodPost, "/v1/messages", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		if got := resp.Header.Get(compat.IgnoredHintsHeader); got != "context_management, cache_control" {
			t.Errorf("%s = %q, want context_management, cache_control", compat.IgnoredHintsHeader, got)
		}
		ev := anthropicEvents(t, b)
		if len(ev["message_start"]) != 1 || len(ev["message_delta"]) != 1 {
			t.Fatalf("events %v", ev)
		}
		start := ev["message_start"][0]["message"].(map[string]any)["usage"].(map[string]any)
		end := ev["message_delta"][0]["usage"].(map[string]any)
		if prompt(start) != count.InputTokens || prompt(end) != count.InputTokens {
			t.Errorf("request %d: message_start usage %v, message_delta usage %v; want the %v prompt tokens count_tokens counted",
				i+1, start, end, count.InputTokens)
		}
		if d := cmp.Diff(start["cache_read_input_tokens"], end["cache_read_input_tokens"]); d != "" {
			t.Errorf("request %d: cached tokens differ between message_start and message_delta: %s", i+1, d)
		}
		cachedSecond = start["cache_read_input_tokens"].(float64)
	}
	if cachedSecond == 0 {
		t.Error("the second request read nothing from the prompt cache")
	}
}

// TestChatHintsHeader: chat completions accept the policy's hints and name them.
func TestChatHintsHeader(t *testing.T) {
	a := startAgent(t, agentOptions{})
	body := chatBody("tiny", 2, false)
	body["service_tier"], body["metadata"], body["prompt_cache_key"], body["store"] = "flex", map[string]string{"k": "v"}, "key", false
	resp, b := a.do(http.MethodPost, "/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got := resp.Header.Get(compat.IgnoredHintsHeader); got != "metadata, service_tier" {
		t.Errorf("%s = %q, want metadata, service_tier", compat.IgnoredHintsHeader, got)
	}
}

// TestResponsesClientFieldsThroughTheAgent: a request shaped like Codex's first one
// (namespace and hosted tools, prompt_cache_key, client_metadata, include, store:
// false) streams through the agent's real handlers, its hints named in the header
// (tool_choice none: the tiny model's template does not render tools).
func TestResponsesClientFieldsThroughTheAgent(t *testing.T) {
	a := startAgent(t, agentOptions{})
	fn := map[string]any{"type": "function", "name": "exec_command", "parameters": map[string]any{"type": "object"}, "strict": false}
	body := map[string]any{"model": "tiny", "stream": true, "max_output_tokens": 4, "store": false, "parallel_tool_calls": true,
		"tool_choice": "none", "prompt_cache_key": "thread-1", "include": []string{"reasoning.encrypted_content"},
		"client_metadata": map[string]any{"session_id": "s"}, "reasoning": map[string]any{"summary": "auto"},
		"tools": []any{fn, map[string]any{"type": "namespace", "name": "agents", "description": "", "tools": []any{
			map[string]any{"type": "function", "name": "spawn_agent", "parameters": map[string]any{"type": "object"}}}},
			map[string]any{"type": "web_search", "external_web_access": false}},
		"input": []any{map[string]any{"type": "message", "role": "developer", "content": []any{map[string]any{"type": "input_text", "text": "Be terse."}}},
			map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "Say hi"}}}}}
	resp, b := a.do(http.MethodPost, "/v1/responses", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got, want := resp.Header.Get(compat.IgnoredHintsHeader), "client_metadata, tools[web_search], reasoning.summary, include"; got != want {
		t.Errorf("%s = %q, want %q", compat.IgnoredHintsHeader, got, want)
	}
	ev := anthropicEvents(t, b) // the same framing: event and data lines
	if len(ev["response.completed"])+len(ev["response.incomplete"]) != 1 {
		t.Fatalf("no completion event in %s", b)
	}
}

package gateway

import (
	"testing"

	"github.com/macfleet/macfleet/gateway/metering"
)

// TestUsageLimits: each API's cap on a request's output, as the agent reads it, and
// its sequences: n choices for chat and text completions, one per input for
// embeddings, none for count_tokens.
func TestUsageLimits(t *testing.T) {
	for _, tc := range []struct {
		endpoint, body string
		want           metering.Limits
	}{
		{"chat_completions", `{"model":"m","n":3,"max_completion_tokens":10,"max_tokens":99}`,
			metering.Limits{Sequences: 3, MaxTokens: 10, Generates: true}},
		{"chat_completions", `{"model":"m","max_completion_tokens":null,"max_tokens":99}`,
			metering.Limits{Sequences: 1, MaxTokens: 99, Generates: true}},
		{"chat_completions", `{"model":"m"}`, metering.Limits{Sequences: 1, Generates: true}},
		{"chat_completions", `{"model":"m","max_tokens":0}`, metering.Limits{Sequences: 1, Generates: true}}, // the agent's 400
		{"completions", `{"model":"m","n":2,"max_tokens":7}`, metering.Limits{Sequences: 2, MaxTokens: 7, Generates: true}},
		// Responses reads max_output_tokens only; Anthropic max_tokens; neither has n.
		{"responses", `{"model":"m","n":4,"max_tokens":1,"max_output_tokens":50}`,
			metering.Limits{Sequences: 1, MaxTokens: 50, Generates: true}},
		{"responses", `{"model":"m","max_tokens":1}`, metering.Limits{Sequences: 1, Generates: true}},
		{"messages", `{"model":"m","n":4,"max_tokens":64}`, metering.Limits{Sequences: 1, MaxTokens: 64, Generates: true}},
		{"embeddings", `{"model":"m","input":"one"}`, metering.Limits{Sequences: 1}},
		{"embeddings", `{"model":"m","input":["a","b","c"]}`, metering.Limits{Sequences: 3}},
		{"embeddings", `{"model":"m","input":[1,2,3]}`, metering.Limits{Sequences: 1}},
		{"embeddings", `{"model":"m","input":[[1],[2]]}`, metering.Limits{Sequences: 2}},
		{"embeddings", `{"model":"m","input":{}}`, metering.Limits{}},
		{"messages_count_tokens", `{"model":"m","max_tokens":64}`, metering.Limits{}},
		{"other", `{"model":"m","n":2}`, metering.Limits{Sequences: 2, Generates: true}},
	} {
		head, aerr := parseHead([]byte(tc.body), 0)
		if aerr != nil {
			t.Fatalf("parseHead(%s): %v", tc.body, aerr)
		}
		if got := usageLimits(tc.endpoint, head, []byte(tc.body)); got != tc.want {
			t.Errorf("usageLimits(%s, %s) = %+v, want %+v", tc.endpoint, tc.body, got, tc.want)
		}
		// The prompt's prefix read for affinity decodes the same caps.
		head, _ = parseHead([]byte(tc.body), 64)
		if got := usageLimits(tc.endpoint, head, []byte(tc.body)); got != tc.want {
			t.Errorf("with affinity, usageLimits(%s, %s) = %+v, want %+v", tc.endpoint, tc.body, got, tc.want)
		}
	}
}

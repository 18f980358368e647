package gateway

import (
	"encoding/json"
	"strconv"
	"strings"

	runnerapi "github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/usagemeter"
)

// outputCaps are the request fields that cap each choice's output; which one counts
// depends on the API (usageLimits).
type outputCaps struct {
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	MaxOutputTokens     json.RawMessage `json:"max_output_tokens"`
}

// capOf is a cap field's positive count; ok false when the field is absent or null.
// A value the agent refuses (not a positive integer) is a cap of 0: no answer, and
// so no usage, follows it.
func capOf(raw json.RawMessage) (n int64, ok bool) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, true
	}
	return n, true
}

// firstCap is the first of the fields that is set, as the agent reads them (chat and
// text completions: max_completion_tokens, else max_tokens); 0 when none is.
func firstCap(fields ...json.RawMessage) int64 {
	for _, f := range fields {
		if n, ok := capOf(f); ok {
			return n
		}
	}
	return 0
}

// usageLimits is the most a request to endpoint can use, as the agent and its runner
// serve it, but for the replica's context (set per attempt): a chat or text
// completion runs n choices capped by max_completion_tokens or max_tokens; a
// Responses request one, capped by max_output_tokens; an Anthropic message one,
// capped by max_tokens; embeddings one sequence per input and generate nothing;
// count_tokens runs none. An unknown endpoint is bounded as a generation of n
// choices without a cap.
func usageLimits(endpoint string, head requestHead, body []byte) metering.Limits {
	c := head.caps
	switch endpoint {
	case "chat_completions", "completions":
		return metering.Limits{Sequences: int64(head.N), MaxTokens: firstCap(c.MaxCompletionTokens, c.MaxTokens), Generates: true}
	case "responses":
		return metering.Limits{Sequences: 1, MaxTokens: firstCap(c.MaxOutputTokens), Generates: true}
	case "messages":
		return metering.Limits{Sequences: 1, MaxTokens: firstCap(c.MaxTokens), Generates: true}
	case "embeddings":
		var req struct {
			Input *runnerapi.Input `json:"input"`
		}
		if json.Unmarshal(body, &req) != nil || req.Input == nil {
			return metering.Limits{} // the agent's 400: no usage
		}
		return metering.Limits{Sequences: int64(req.Input.Len())}
	case "messages_count_tokens":
		return metering.Limits{}
	}
	return metering.Limits{Sequences: int64(head.N), Generates: true}
}

// newMeter is the meter of the answers' usage: counted in m's series and, with
// Options.Budgets, in the budgets' ledger.
func newMeter(opts Options, m *metrics) *usagemeter.Meter {
	var ledger usagemeter.Ledger
	if opts.Budgets != nil {
		ledger = opts.Budgets
	}
	return usagemeter.New(usagemeter.Metrics{Usage: m.usage, Clamped: m.usageClamped, Disagreements: m.countDisagreements},
		ledger, opts.Log)
}

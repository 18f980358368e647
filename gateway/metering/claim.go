package metering

import (
	"github.com/macfleet/macfleet/api/engine"
)

// A usage report is a claim, not a fact: it comes from the Mac that answered, which
// the gateway does not vouch for. The gateway bounds each report by what the request
// could have used (Limits.Bound, Clamp) and keeps every sum of counts within
// MaxCount (AddCount), so no report charges a caller more than its request could
// cost and no sum wraps negative.

// Limits is what the gateway knows, before an answer, of the most it can use.
type Limits struct {
	// Context is the serving replica's context of one sequence (its engine's
	// contextLength); 0 when unknown, which bounds as engine.MaxContextLength.
	Context int64
	// Sequences is how many sequences the request runs: its choices (n) for a chat or
	// text completion, its inputs for embeddings, 0 for a request that runs none
	// (count_tokens: its answer reports no usage).
	Sequences int64
	// MaxTokens is the request's cap on each choice's output (max_tokens,
	// max_completion_tokens or max_output_tokens, as its API reads them); 0 when it
	// sets none: the context is the cap.
	MaxTokens int64
	// Generates is false for a request that generates nothing (embeddings).
	Generates bool
}

// SlotRounding is what a runner's slot may hold beyond its contextLength: llama.cpp
// rounds the context's cells up to a multiple of 256, then each sequence's again.
const SlotRounding = 512

// Bound is the most an answer within l uses: input, a slot of each sequence; output,
// each choice's cap (its max_tokens, at most a slot); cached, the input. A slot is
// the context plus SlotRounding.
func (l Limits) Bound() Usage {
	ctx := l.Context
	if ctx <= 0 || ctx > engine.MaxContextLength {
		ctx = engine.MaxContextLength
	}
	ctx += SlotRounding
	seq := max(l.Sequences, 0)
	b := Usage{Input: ctx * seq}
	b.Cached = b.Input
	if l.Generates {
		per := ctx
		if l.MaxTokens > 0 && l.MaxTokens < ctx {
			per = l.MaxTokens
		}
		b.Output = per * seq
	}
	return b
}

// Reasons a report is cut or refused, the reason label of the gateway's
// macfleet_gateway_usage_clamped_total.
const (
	// ClampInput: more input than the request's sequences hold.
	ClampInput = "input_over_bound"
	// ClampOutput: more output than the request's choices may generate.
	ClampOutput = "output_over_bound"
	// ClampCached: more cached tokens than input.
	ClampCached = "cached_over_input"
	// ClampUnreadable: a report Parse refuses (a negative or malformed count); it
	// counts nothing.
	ClampUnreadable = "unreadable"
)

// Clamp is u within bound b: a count above its bound is cut to it, and Cached to the
// Input that is left (a negative count, which Parse refuses, is 0); reasons name
// each cut (none when u was within b).
func Clamp(u, b Usage) (Usage, []string) {
	var reasons []string
	u = Usage{Input: max(u.Input, 0), Cached: max(u.Cached, 0), Output: max(u.Output, 0)}
	if u.Input > b.Input {
		u.Input, reasons = b.Input, append(reasons, ClampInput)
	}
	if u.Output > b.Output {
		u.Output, reasons = b.Output, append(reasons, ClampOutput)
	}
	if c := min(b.Cached, u.Input); u.Cached > c {
		u.Cached, reasons = c, append(reasons, ClampCached)
	}
	return u, reasons
}

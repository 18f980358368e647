package translate

import (
	"encoding/json"
	"slices"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// A Responses request asks for its output text's logprobs with include
// message.output_text.logprobs (or top_logprobs above 0): the chat request asks for
// logprobs (and top_logprobs alternatives), and each output_text.delta carries the
// logprobs of the tokens whose text it carries, in the chat's shape (token, logprob,
// bytes, top_logprobs), the done events and the response all of the message's.
// Logprobs that come without text (tokens whose text the runner still holds, at the
// end of the answer) go with the next text, or with the done events; a reasoning
// chunk's are not reported (reasoning_text has none).

// includeLogprobs is the include item that asks for the output text's logprobs.
const includeLogprobs = "message.output_text.logprobs"

// wantsLogprobs: the request asks for its output text's logprobs.
func (q *ResponsesRequest) wantsLogprobs() bool {
	return slices.Contains(q.Include, includeLogprobs) || q.TopLogprobs != nil && *q.TopLogprobs > 0
}

// logprobsFields adds the chat request's logprobs fields of q to chat, and names the
// include items that add nothing in hints.
func logprobsFields(q *ResponsesRequest, chat map[string]any, hints []string) []string {
	if q.wantsLogprobs() {
		chat["logprobs"] = true
		if q.TopLogprobs != nil {
			chat["top_logprobs"] = *q.TopLogprobs
		}
	}
	for _, inc := range q.Include {
		if inc != includeLogprobs {
			return append(hints, "include")
		}
	}
	return hints
}

// responsesLogprobs is the logprobs field of an output_text part or event: never null.
func responsesLogprobs(lps []runnerapi.TokenLogprob) []runnerapi.TokenLogprob {
	if lps == nil {
		return []runnerapi.TokenLogprob{}
	}
	return lps
}

// tokens are the logprobs the output_text delta of chunk choice ch carries: those
// pending and ch's, when it carries text; else ch's are pending (a reasoning or tool
// call chunk's are dropped) and it carries none.
func (s *responseState) tokens(ch runnerapi.ChatChunkChoice) []runnerapi.TokenLogprob {
	var lps []runnerapi.TokenLogprob
	if ch.Logprobs != nil {
		lps = ch.Logprobs.Content
	}
	d := ch.Delta
	switch {
	case d.Content != nil && *d.Content != "":
		lps, s.pending = append(s.pending, lps...), nil
		return lps
	case (d.ReasoningContent == nil || *d.ReasoningContent == "") && len(d.ToolCalls) == 0:
		s.pending = append(s.pending, lps...)
	}
	return nil
}

// resumedLogprobs are the logprobs of the text the client of a resumed stream has:
// those of the output_text parts of the final assistant message of input (the
// gateway sends them back as the parts' logprobs).
func resumedLogprobs(input json.RawMessage) []runnerapi.TokenLogprob {
	var items []item
	if json.Unmarshal(input, &items) != nil || len(items) == 0 || items[len(items)-1].Role != "assistant" {
		return nil
	}
	var parts []struct {
		Type     string                   `json:"type"`
		Logprobs []runnerapi.TokenLogprob `json:"logprobs"`
	}
	_ = json.Unmarshal(items[len(items)-1].Content, &parts)
	var lps []runnerapi.TokenLogprob
	for _, p := range parts {
		if p.Type == "output_text" {
			lps = append(lps, p.Logprobs...)
		}
	}
	return lps
}

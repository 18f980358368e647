package translate

// Writing a Messages response: whole, or as the Anthropic event stream.

import (
	"net/http"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// stopReason maps a chat finish reason and the stop string that ended the answer to
// Anthropic's stop_reason and stop_sequence.
func stopReason(finish, stopSeq string) (string, any) {
	switch {
	case finish == "length":
		return "max_tokens", nil
	case finish == "tool_calls":
		return "tool_use", nil
	case stopSeq != "":
		return "stop_sequence", stopSeq
	}
	return "end_turn", nil
}

type anthropicWhole struct{ w http.ResponseWriter }

func (a *anthropicWhole) whole(c *runnerapi.ChatCompletion) {
	ch := c.Choices[0]
	content := []map[string]any{}
	if ch.Message.ReasoningContent != "" {
		content = append(content, map[string]any{"type": "thinking", "thinking": ch.Message.ReasoningContent, "signature": ""})
	}
	if t := ch.Message.Text(); t != "" {
		content = append(content, map[string]any{"type": "text", "text": t})
	}
	for _, tc := range ch.Message.ToolCalls {
		content = append(content, map[string]any{"type": "tool_use", "id": toolUseID(tc.ID), "name": tc.Function.Name,
			"input": argsObject(tc.Function.Arguments)})
	}
	reason, seq := stopReason(ch.FinishReason, ch.StopSequence)
	writeJSON(a.w, http.StatusOK, map[string]any{"id": "msg_" + strings.TrimPrefix(c.ID, "chatcmpl-"), "type": "message",
		"role": "assistant", "model": c.Model, "content": content, "stop_reason": reason,
		"stop_sequence": seq, "usage": anthropicUsage(c.Usage)})
}

func (a *anthropicWhole) chunk(*runnerapi.ChatCompletionChunk) {}
func (a *anthropicWhole) end(*chatError)                       {}
func (a *anthropicWhole) fail(e *chatError)                    { anthropicError(a.w, e) }

// toolUseID keeps a call's id, in Anthropic's form.
func toolUseID(id string) string { return "toolu_" + strings.TrimPrefix(id, "call_") }

// anthropicStream turns chat chunks into Anthropic stream events: one content block
// at a time (thinking, text, each tool use), then message_delta and message_stop.
type anthropicStream struct {
	w       http.ResponseWriter
	sse     *sse
	model   string
	started bool
	index   int    // the open block's index
	open    string // the open block's kind: "", thinking, text, tool_use
	finish  string
	stopSeq string
	usage   *runnerapi.Usage
}

// start sends message_start with the prompt's usage, which the chat stream's first
// chunk carries (runnerapi.HeaderPromptUsage).
func (a *anthropicStream) start(id string, prompt *runnerapi.Usage) {
	if a.started {
		return
	}
	a.started = true
	var usage *runnerapi.Usage
	if prompt != nil {
		usage = &runnerapi.Usage{PromptTokens: prompt.PromptTokens, PromptTokensDetails: prompt.PromptTokensDetails}
	}
	a.sse.send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": "msg_" + strings.TrimPrefix(id, "chatcmpl-"), "type": "message", "role": "assistant", "model": a.model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": anthropicUsage(usage)}})
}

// block opens a block of kind (closing the open one) unless it is already open.
func (a *anthropicStream) block(kind string, cb map[string]any) {
	if a.open == kind && kind != "tool_use" {
		return
	}
	a.closeBlock()
	a.open = kind
	a.sse.send("content_block_start", map[string]any{"type": "content_block_start", "index": a.index, "content_block": cb})
}

func (a *anthropicStream) closeBlock() {
	if a.open == "" {
		return
	}
	a.sse.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": a.index})
	a.open = ""
	a.index++
}

func (a *anthropicStream) delta(d map[string]any) {
	a.sse.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": a.index, "delta": d})
}

func (a *anthropicStream) chunk(c *runnerapi.ChatCompletionChunk) {
	a.start(c.ID, c.Usage)
	if c.Usage != nil {
		a.usage = c.Usage
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		if d.ReasoningContent != nil && *d.ReasoningContent != "" {
			a.block("thinking", map[string]any{"type": "thinking", "thinking": "", "signature": ""})
			a.delta(map[string]any{"type": "thinking_delta", "thinking": *d.ReasoningContent})
		}
		if d.Content != nil && *d.Content != "" {
			a.block("text", map[string]any{"type": "text", "text": ""})
			a.delta(map[string]any{"type": "text_delta", "text": *d.Content})
		}
		for _, tc := range d.ToolCalls {
			if tc.ID != "" {
				a.block("tool_use", map[string]any{"type": "tool_use", "id": toolUseID(tc.ID), "name": tc.Function.Name,
					"input": map[string]any{}})
			}
			if tc.Function.Arguments != "" {
				a.delta(map[string]any{"type": "input_json_delta", "partial_json": tc.Function.Arguments})
			}
		}
		if ch.FinishReason != nil {
			a.finish, a.stopSeq = *ch.FinishReason, ch.StopSequence
		}
	}
}

func (a *anthropicStream) end(err *chatError) {
	if err != nil {
		if !a.started {
			a.fail(err)
			return
		}
		a.sse.send("error", anthropicErrorBody(err))
		return
	}
	a.start("", nil)
	a.closeBlock()
	reason, seq := stopReason(a.finish, a.stopSeq)
	a.sse.send("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": reason, "stop_sequence": seq}, "usage": anthropicUsage(a.usage)})
	a.sse.send("message_stop", map[string]any{"type": "message_stop"})
}

func (a *anthropicStream) whole(*runnerapi.ChatCompletion) {}
func (a *anthropicStream) fail(e *chatError)               { anthropicError(a.w, e) }

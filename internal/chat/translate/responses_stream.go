package translate

import (
	"encoding/json"
	"maps"
	"net/http"
	"strconv"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// responseState builds a Responses answer from the chat handler's: the whole response
// object, or the stream of events that build it item by item.
type responseState struct {
	w       http.ResponseWriter
	req     *ResponsesRequest
	names   map[string]toolName // the model's function names → the client's
	custom  map[string]bool     // the model's function names that are custom tools
	created int64
	sse     *sse // nil: not streamed

	id      string
	model   string
	output  []map[string]any
	finish  string
	usage   *runnerapi.Usage
	seq     int
	started bool
	// the open item of a stream: its kind (reasoning, message, function_call,
	// custom_tool_call) and text (a call's arguments)
	open string
	text strings.Builder
	// inputSent is what of the open custom tool call's input has been streamed
	inputSent string
	itemsID   int
	// lps are the open message's tokens' logprobs (responses_logprobs.go), pending
	// those of chunks without text yet (they go with the next text, or the done
	// events).
	lps, pending []runnerapi.TokenLogprob
}

func (s *responseState) nextID(prefix string) string {
	s.itemsID++
	return prefix + strings.TrimPrefix(s.id, "resp_") + "_" + strconv.Itoa(s.itemsID)
}

// object is the response object as it stands.
func (s *responseState) object(status string) map[string]any {
	var instructions any
	if s.req.Instructions != nil {
		instructions = *s.req.Instructions
	}
	o := map[string]any{"id": s.id, "object": "response", "created_at": s.created, "status": status,
		"error": nil, "incomplete_details": nil, "instructions": instructions, "model": s.model,
		"output": nonNilItems(s.output), "parallel_tool_calls": s.req.ParallelToolCalls == nil || *s.req.ParallelToolCalls,
		"previous_response_id": nil, "store": false, "truncation": "disabled", "tools": nonNilTools(s.req.Tools),
		"tool_choice": "auto", "metadata": map[string]any{}, "text": map[string]any{"format": map[string]any{"type": "text"}}}
	if s.req.Text != nil && len(s.req.Text.Format) > 0 {
		o["text"] = map[string]any{"format": s.req.Text.Format}
	}
	if len(s.req.ToolChoice) > 0 {
		o["tool_choice"] = s.req.ToolChoice
	}
	if len(s.req.Metadata) > 0 {
		o["metadata"] = s.req.Metadata
	}
	if s.req.Temperature != nil {
		o["temperature"] = *s.req.Temperature
	}
	if s.req.TopP != nil {
		o["top_p"] = *s.req.TopP
	}
	if s.req.MaxOutputTokens != nil {
		o["max_output_tokens"] = *s.req.MaxOutputTokens
	}
	if status == "incomplete" {
		o["incomplete_details"] = map[string]any{"reason": "max_output_tokens"}
	}
	if s.usage != nil {
		cached := 0
		if s.usage.PromptTokensDetails != nil {
			cached = s.usage.PromptTokensDetails.CachedTokens
		}
		o["usage"] = map[string]any{"input_tokens": s.usage.PromptTokens,
			"input_tokens_details":  map[string]any{"cached_tokens": cached},
			"output_tokens":         s.usage.CompletionTokens,
			"output_tokens_details": map[string]any{"reasoning_tokens": 0},
			"total_tokens":          s.usage.TotalTokens}
	}
	return o
}

func nonNilItems(l []map[string]any) []map[string]any {
	if l == nil {
		return []map[string]any{}
	}
	return l
}

func nonNilTools(l []json.RawMessage) []json.RawMessage {
	if l == nil {
		return []json.RawMessage{}
	}
	return l
}

func (s *responseState) status() string {
	if s.finish == "length" {
		return "incomplete"
	}
	return "completed"
}

func reasoningText(text string) map[string]any {
	return map[string]any{"type": "reasoning_text", "text": text}
}

func reasoningItem(id, text, status string) map[string]any {
	content := []map[string]any{}
	if status == "completed" {
		content = append(content, reasoningText(text))
	}
	return map[string]any{"type": "reasoning", "id": id, "summary": []any{}, "content": content, "status": status}
}

func outputText(text string, lps []runnerapi.TokenLogprob) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": responsesLogprobs(lps)}
}

func messageItem(id, text, status string, lps []runnerapi.TokenLogprob) map[string]any {
	content := []map[string]any{}
	if status == "completed" {
		content = append(content, outputText(text, lps))
	}
	return map[string]any{"type": "message", "id": id, "status": status, "role": "assistant", "content": content}
}

func callItem(id, callID, name, args, status string) map[string]any {
	return map[string]any{"type": "function_call", "id": id, "call_id": callID, "name": name, "arguments": args, "status": status}
}

// call is the function_call item of a call the model made by its flattened name: in
// the client's name, with its namespace.
func (s *responseState) call(id, callID, name, args, status string) map[string]any {
	n, ok := s.names[name]
	if s.custom[name] {
		return customCallItem(id, callID, n.name, customInput(args))
	}
	if !ok {
		return callItem(id, callID, name, args, status)
	}
	item := callItem(id, callID, n.name, args, status)
	if n.namespace != "" {
		item["namespace"] = n.namespace
	}
	return item
}

func (s *responseState) whole(c *runnerapi.ChatCompletion) {
	s.id, s.model, s.usage = "resp_"+strings.TrimPrefix(c.ID, "chatcmpl-"), c.Model, c.Usage
	ch := c.Choices[0]
	s.finish = ch.FinishReason
	if r := ch.Message.ReasoningContent; r != "" {
		s.output = append(s.output, reasoningItem(s.nextID("rs_"), r, "completed"))
	}
	if t := ch.Message.Text(); t != "" || len(ch.Message.ToolCalls) == 0 {
		var lps []runnerapi.TokenLogprob
		if ch.Logprobs != nil {
			lps = ch.Logprobs.Content
		}
		s.output = append(s.output, messageItem(s.nextID("msg_"), t, "completed", lps))
	}
	for _, tc := range ch.Message.ToolCalls {
		s.output = append(s.output, s.call(s.nextID("fc_"), tc.ID, tc.Function.Name, tc.Function.Arguments, "completed"))
	}
	writeJSON(s.w, http.StatusOK, s.object(s.status()))
}

func (s *responseState) fail(e *chatError) { openAIError(s.w, e) }

// send sends one stream event with its sequence number.
func (s *responseState) send(typ string, fields map[string]any) {
	fields["type"] = typ
	fields["sequence_number"] = s.seq
	s.seq++
	s.sse.send(typ, fields)
}

func (s *responseState) chunk(c *runnerapi.ChatCompletionChunk) {
	if !s.started {
		s.started = true
		s.id, s.model = "resp_"+strings.TrimPrefix(c.ID, "chatcmpl-"), c.Model
		s.send("response.created", map[string]any{"response": s.object("in_progress")})
		s.send("response.in_progress", map[string]any{"response": s.object("in_progress")})
	}
	if s.model == "" { // a resumed stream's
		s.model = c.Model
	}
	if c.Usage != nil {
		s.usage = c.Usage
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		if d.ReasoningContent != nil && *d.ReasoningContent != "" {
			s.openItem("reasoning")
			s.text.WriteString(*d.ReasoningContent)
			s.send("response.reasoning_text.delta", map[string]any{"item_id": s.currentID(), "output_index": len(s.output) - 1,
				"content_index": 0, "delta": *d.ReasoningContent})
		}
		lps := s.tokens(ch)
		if d.Content != nil && *d.Content != "" {
			s.openItem("message")
			s.text.WriteString(*d.Content)
			s.lps = append(s.lps, lps...)
			s.send("response.output_text.delta", map[string]any{"item_id": s.currentID(), "output_index": len(s.output) - 1,
				"content_index": 0, "delta": *d.Content, "logprobs": responsesLogprobs(lps)})
		}
		for _, tc := range d.ToolCalls {
			if tc.ID != "" {
				s.closeItem()
				s.open = "function_call"
				if s.custom[tc.Function.Name] {
					s.open = "custom_tool_call"
				}
				item := s.call(s.nextID("fc_"), tc.ID, tc.Function.Name, "", "in_progress")
				s.output = append(s.output, item)
				s.send("response.output_item.added", map[string]any{"output_index": len(s.output) - 1, "item": item})
			}
			if tc.Function.Arguments != "" && s.open == "function_call" {
				s.text.WriteString(tc.Function.Arguments)
				s.send("response.function_call_arguments.delta", map[string]any{"item_id": s.currentID(),
					"output_index": len(s.output) - 1, "delta": tc.Function.Arguments})
			}
			if tc.Function.Arguments != "" && s.open == "custom_tool_call" {
				s.text.WriteString(tc.Function.Arguments)
				s.customDelta()
			}
		}
		if ch.FinishReason != nil {
			s.finish = *ch.FinishReason
		}
	}
}

func (s *responseState) currentID() string { return s.output[len(s.output)-1]["id"].(string) }

// openItem opens an item of kind unless it is the open one.
func (s *responseState) openItem(kind string) {
	if s.open == kind {
		return
	}
	s.closeItem()
	s.open = kind
	var item map[string]any
	if kind == "reasoning" {
		item = reasoningItem(s.nextID("rs_"), "", "in_progress")
	} else {
		item = messageItem(s.nextID("msg_"), "", "in_progress", nil)
	}
	s.output = append(s.output, item)
	idx := len(s.output) - 1
	s.send("response.output_item.added", map[string]any{"output_index": idx, "item": item})
	part := outputText("", nil)
	if kind == "reasoning" {
		part = reasoningText("")
	}
	s.send("response.content_part.added", map[string]any{"item_id": item["id"], "output_index": idx, "content_index": 0, "part": part})
}

// closeItem finishes the open item: its done events, then output_item.done.
func (s *responseState) closeItem() {
	if s.open == "" {
		return
	}
	idx := len(s.output) - 1
	id := s.currentID()
	text := s.text.String()
	var item map[string]any
	switch s.open {
	case "reasoning":
		s.send("response.reasoning_text.done", map[string]any{"item_id": id, "output_index": idx, "content_index": 0, "text": text})
		s.send("response.content_part.done", map[string]any{"item_id": id, "output_index": idx, "content_index": 0,
			"part": reasoningText(text)})
		item = reasoningItem(id, text, "completed")
	case "message":
		s.lps, s.pending = append(s.lps, s.pending...), nil
		s.send("response.output_text.done", map[string]any{"item_id": id, "output_index": idx, "content_index": 0,
			"text": text, "logprobs": responsesLogprobs(s.lps)})
		s.send("response.content_part.done", map[string]any{"item_id": id, "output_index": idx, "content_index": 0,
			"part": outputText(text, s.lps)})
		item = messageItem(id, text, "completed", s.lps)
		s.lps = nil
	case "function_call":
		prev := s.output[idx]
		s.send("response.function_call_arguments.done", map[string]any{"item_id": id, "output_index": idx,
			"name": prev["name"], "arguments": text})
		item = maps.Clone(prev)
		item["arguments"], item["status"] = text, "completed"
	case "custom_tool_call":
		item = s.customDone(idx)
	}
	s.output[idx] = item
	s.send("response.output_item.done", map[string]any{"output_index": idx, "item": item})
	s.open = ""
	s.text.Reset()
}

func (s *responseState) end(err *chatError) {
	if err != nil {
		if !s.started {
			s.fail(err)
			return
		}
		s.send("error", map[string]any{"code": err.Code, "message": err.Message, "param": nil})
		o := s.object("failed")
		o["error"] = map[string]any{"code": "server_error", "message": err.Message}
		s.send("response.failed", map[string]any{"response": o})
		return
	}
	if !s.started {
		s.chunk(&runnerapi.ChatCompletionChunk{})
	}
	s.closeItem()
	status := s.status()
	event := "response.completed"
	if status == "incomplete" {
		event = "response.incomplete"
	}
	s.send(event, map[string]any{"response": s.object(status)})
}

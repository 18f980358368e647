//go:build cgo && !race

package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/macfleet/macfleet/chat"
	"github.com/macfleet/macfleet/runner/api"
)

// responder writes one completion in OpenAI's shapes. For a chat, parser splits the
// model's text into content, reasoning and tool calls.
type responder struct {
	w            http.ResponseWriter
	chat         bool
	parser       *chat.Parser
	id           string
	created      int64
	model        string
	promptTokens int
	includeUsage bool
}

func (o *responder) usage(u update) *api.Usage {
	us := &api.Usage{PromptTokens: o.promptTokens, CompletionTokens: u.generated,
		TotalTokens: o.promptTokens + u.generated}
	if u.cached > 0 {
		us.PromptTokensDetails = &api.PromptTokensDetails{CachedTokens: u.cached}
	}
	return us
}

// finishReason is tool_calls when the model stopped after calling tools.
func (o *responder) finishReason(finish string) string {
	if finish == "stop" && o.parser != nil && o.parser.Calls() > 0 {
		return "tool_calls"
	}
	return finish
}

func (o *responder) whole(r *http.Request, j *job) {
	var sb strings.Builder
	for {
		select {
		case <-j.notify:
		case <-r.Context().Done():
			return
		}
		u := j.take()
		sb.WriteString(u.text)
		if !u.done {
			continue
		}
		if u.err != nil {
			writeError(o.w, u.err)
			return
		}
		if !o.chat {
			finish := u.finish
			writeJSON(o.w, http.StatusOK, api.Completion{
				ID: o.id, Object: "text_completion", Created: o.created, Model: o.model,
				Choices: []api.TextChoice{{Text: sb.String(), FinishReason: &finish}},
				Usage:   o.usage(u),
			})
			return
		}
		d := o.parser.Push(sb.String())
		rest := o.parser.Finish()
		msg := api.ChatMessageOut{Role: "assistant", ReasoningContent: d.Reasoning + rest.Reasoning,
			ToolCalls: append(d.ToolCalls, rest.ToolCalls...)}
		if content := d.Content + rest.Content; content != "" || len(msg.ToolCalls) == 0 {
			msg.Content = &content
		}
		for i := range msg.ToolCalls {
			msg.ToolCalls[i].Index = nil
		}
		writeJSON(o.w, http.StatusOK, api.ChatCompletion{
			ID: o.id, Object: "chat.completion", Created: o.created, Model: o.model,
			Choices: []api.ChatChoice{{Message: msg, FinishReason: o.finishReason(u.finish)}},
			Usage:   o.usage(u),
		})
		return
	}
}

// stream sends SSE events. The status line goes out with the first text (or the end),
// so a failure before any output is an ordinary error response with its status.
func (o *responder) stream(r *http.Request, j *job) {
	rc := http.NewResponseController(o.w)
	started := false
	send := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(o.w, "data: %s\n\n", b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	for {
		select {
		case <-j.notify:
		case <-r.Context().Done():
			return
		}
		u := j.take()
		if !started {
			if u.err != nil {
				writeError(o.w, u.err)
				return
			}
			if u.text == "" && !u.done {
				continue
			}
			h := o.w.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			h.Set("X-Accel-Buffering", "no")
			o.w.WriteHeader(http.StatusOK)
			started = true
			if o.chat && !send(o.chatChunk(api.ChatDelta{Role: "assistant", Content: ptr("")}, nil)) {
				return
			}
		}
		if u.text != "" && !o.sendText(send, u.text) {
			return
		}
		if !u.done {
			continue
		}
		if u.err != nil {
			send(u.err)
			return
		}
		if o.chat && !o.sendDelta(send, o.parser.Finish()) {
			return
		}
		finish := o.finishReason(u.finish)
		var final any = o.chatChunk(api.ChatDelta{}, &finish)
		if !o.chat {
			final = api.Completion{ID: o.id, Object: "text_completion", Created: o.created, Model: o.model,
				Choices: []api.TextChoice{{Text: "", FinishReason: &finish}}}
		}
		if !send(final) {
			return
		}
		if o.includeUsage {
			obj := "chat.completion.chunk"
			if !o.chat {
				obj = "text_completion"
			}
			if !send(struct {
				ID      string     `json:"id"`
				Object  string     `json:"object"`
				Created int64      `json:"created"`
				Model   string     `json:"model"`
				Choices []struct{} `json:"choices"`
				Usage   *api.Usage `json:"usage"`
			}{o.id, obj, o.created, o.model, []struct{}{}, o.usage(u)}) {
				return
			}
		}
		if _, err := io.WriteString(o.w, "data: [DONE]\n\n"); err == nil {
			_ = rc.Flush()
		}
		return
	}
}

// sendText sends generated text: as is for a text completion, through the parser for
// a chat.
func (o *responder) sendText(send func(any) bool, text string) bool {
	if !o.chat {
		return send(api.Completion{ID: o.id, Object: "text_completion", Created: o.created, Model: o.model,
			Choices: []api.TextChoice{{Text: text}}})
	}
	return o.sendDelta(send, o.parser.Push(text))
}

// sendDelta sends what the parser decided: reasoning, content, then each tool call as
// OpenAI streams them (a first chunk with id, type and name, then the arguments).
func (o *responder) sendDelta(send func(any) bool, d chat.Delta) bool {
	if d.Reasoning != "" && !send(o.chatChunk(api.ChatDelta{ReasoningContent: &d.Reasoning}, nil)) {
		return false
	}
	if d.Content != "" && !send(o.chatChunk(api.ChatDelta{Content: &d.Content}, nil)) {
		return false
	}
	for _, c := range d.ToolCalls {
		head := api.ToolCall{Index: c.Index, ID: c.ID, Type: c.Type, Function: api.FunctionCall{Name: c.Function.Name}}
		args := api.ToolCall{Index: c.Index, Function: api.FunctionCall{Arguments: c.Function.Arguments}}
		if !send(o.chatChunk(api.ChatDelta{ToolCalls: []api.ToolCall{head}}, nil)) ||
			!send(o.chatChunk(api.ChatDelta{ToolCalls: []api.ToolCall{args}}, nil)) {
			return false
		}
	}
	return true
}

func (o *responder) chatChunk(d api.ChatDelta, finish *string) api.ChatCompletionChunk {
	return api.ChatCompletionChunk{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.model,
		Choices: []api.ChatChunkChoice{{Delta: d, FinishReason: finish}}}
}

//go:build cgo && !race

package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
)

// responder writes one completion in OpenAI's shapes: n choices, each its own job.
// For a chat, each choice's parser splits the model's text into content, reasoning
// and tool calls.
type responder struct {
	w            http.ResponseWriter
	chat         bool
	choices      []*choice
	notify       chan struct{} // shared by the choices' jobs
	id           string
	created      int64
	model        string
	promptTokens int
	// continuedPrompt are the prompt's last tokens that are the continued answer's
	// (runnerapi.HeaderContinue), not counted as prompt tokens; continued is how many
	// completion tokens that answer counts as (runnerapi.Options).
	continuedPrompt, continued int
	// tokenCounts puts each choice's generated tokens so far before each event that
	// carries its output (runnerapi.HeaderTokenCounts).
	tokenCounts bool
	// tokenIDs puts on each count line the ids of the choice's tokens generated
	// since its previous one (runnerapi.HeaderTokenIDs).
	tokenIDs     bool
	includeUsage bool
	// usageFirst puts the prompt's usage on the first chunk too (runnerapi.HeaderPromptUsage).
	usageFirst bool
	logprobs   bool
}

// choice is one sequence of a completion.
type choice struct {
	index  int
	j      *job
	parser *chat.Parser
	text   strings.Builder          // whole response: everything generated
	lps    []runnerapi.TokenLogprob // logprobs not yet sent (stream) or all (whole)
	offset int                      // text sent so far, for the legacy text_offset
	cached int                      // prompt tokens reused, as of the last update
	unsent []int32                  // tokens generated that no count line named yet
	last   update                   // the final update, once done
	done   bool
}

// poll takes what each unfinished choice produced; it returns the first error and
// whether every choice is done.
func (o *responder) poll(each func(c *choice, u update) bool) (err *runnerapi.Error, all, ok bool) {
	all = true
	for _, c := range o.choices {
		if c.done {
			continue
		}
		u := c.j.take()
		if u.err != nil && err == nil {
			err = u.err
		}
		if u.done {
			c.done, c.last = true, u
		} else {
			all = false
		}
		if !each(c, u) {
			return err, all, false
		}
	}
	return err, all, true
}

// usage counts the prompt and every choice's generated tokens. A continued answer's
// tokens already in the prompt (continued) count as completion tokens, and the cached
// tokens at most the rest of the prompt.
func (o *responder) usage() *runnerapi.Usage {
	us := &runnerapi.Usage{PromptTokens: o.promptTokens - o.continuedPrompt, CompletionTokens: o.continued}
	var spec runnerapi.CompletionTokensDetails
	for _, c := range o.choices {
		us.CompletionTokens += c.last.generated
		spec.AcceptedPredictionTokens += c.last.accepted
		spec.RejectedPredictionTokens += c.last.rejected
	}
	if spec != (runnerapi.CompletionTokensDetails{}) {
		us.CompletionTokensDetails = &spec
	}
	us.TotalTokens = us.PromptTokens + us.CompletionTokens
	if cached := min(o.choices[0].last.cached, us.PromptTokens); cached > 0 {
		us.PromptTokensDetails = &runnerapi.PromptTokensDetails{CachedTokens: cached}
	}
	return us
}

// promptUsage is the usage of the prompt alone, as known when the first output of c
// (the first choice) arrived.
func (o *responder) promptUsage(c *choice) *runnerapi.Usage {
	prompt := o.promptTokens - o.continuedPrompt
	us := &runnerapi.Usage{PromptTokens: prompt, TotalTokens: prompt}
	if cached := min(c.cached, prompt); cached > 0 {
		us.PromptTokensDetails = &runnerapi.PromptTokensDetails{CachedTokens: cached}
	}
	return us
}

// promptCount is the comment line of the prompt's usage u
// (runnerapi.PromptCountComment).
func promptCount(u *runnerapi.Usage) string {
	cached := 0
	if u.PromptTokensDetails != nil {
		cached = u.PromptTokensDetails.CachedTokens
	}
	return runnerapi.PromptCountComment + " " + strconv.Itoa(u.PromptTokens) + " " + strconv.Itoa(cached) + "\n"
}

// finishReason is tool_calls when the model stopped after calling tools.
func (c *choice) finishReason() string {
	if c.last.finish == "stop" && c.parser != nil && c.parser.Calls() > 0 {
		return "tool_calls"
	}
	return c.last.finish
}

func (o *responder) wait(r *http.Request) bool {
	select {
	case <-o.notify:
		return true
	case <-r.Context().Done():
		return false
	}
}

func (o *responder) whole(r *http.Request) {
	for o.wait(r) {
		err, all, _ := o.poll(func(c *choice, u update) bool {
			c.text.WriteString(u.text)
			c.lps = append(c.lps, u.logprobs...)
			return true
		})
		if err != nil {
			writeError(o.w, err)
			return
		}
		if !all {
			continue
		}
		if !o.chat {
			out := runnerapi.Completion{ID: o.id, Object: "text_completion", Created: o.created, Model: o.model, Usage: o.usage()}
			for _, c := range o.choices {
				finish := c.last.finish
				tc := runnerapi.TextChoice{Index: c.index, Text: c.text.String(), FinishReason: &finish, StopSequence: c.last.stopSeq}
				if o.logprobs {
					tc.Logprobs = runnerapi.TextLogprobsOf(c.lps, 0)
				}
				out.Choices = append(out.Choices, tc)
			}
			writeJSON(o.w, http.StatusOK, out)
			return
		}
		out := runnerapi.ChatCompletion{ID: o.id, Object: "chat.completion", Created: o.created, Model: o.model, Usage: o.usage()}
		for _, c := range o.choices {
			d := c.parser.Push(c.text.String())
			rest := c.parser.Finish()
			msg := runnerapi.ChatMessageOut{Role: "assistant", ReasoningContent: d.Reasoning + rest.Reasoning,
				ToolCalls: append(d.ToolCalls, rest.ToolCalls...)}
			if content := d.Content + rest.Content; content != "" || len(msg.ToolCalls) == 0 {
				msg.Content = &content
			}
			for i := range msg.ToolCalls {
				msg.ToolCalls[i].Index = nil
			}
			cc := runnerapi.ChatChoice{Index: c.index, Message: msg, FinishReason: c.finishReason(), StopSequence: c.last.stopSeq}
			if o.logprobs {
				cc.Logprobs = &runnerapi.ChatLogprobs{Content: nonNil(c.lps), Refusal: []runnerapi.TokenLogprob{}}
			}
			out.Choices = append(out.Choices, cc)
		}
		writeJSON(o.w, http.StatusOK, out)
		return
	}
}

func nonNil(l []runnerapi.TokenLogprob) []runnerapi.TokenLogprob {
	if l == nil {
		return []runnerapi.TokenLogprob{}
	}
	return l
}

// stream sends SSE events. The status line goes out with the first text (or the end),
// so a failure before any output is an ordinary error response with its status.
func (o *responder) stream(r *http.Request) {
	rc := http.NewResponseController(o.w)
	started := false
	send := func(v any) bool { return o.sendEvent(rc, "", v) }
	var pending []func() bool // output taken before the stream started
	for o.wait(r) {
		err, all, ok := o.poll(func(c *choice, u update) bool {
			step := o.outputStep(rc, send, c, u)
			if !started {
				pending = append(pending, step)
				return true
			}
			return step()
		})
		if !ok {
			return
		}
		if !started {
			if err != nil {
				writeError(o.w, err)
				return
			}
			if len(pending) == 0 {
				continue
			}
			started = true
			if !o.startStream(rc) {
				return
			}
			for _, step := range pending {
				if !step() {
					return
				}
			}
			pending = nil
		}
		if err != nil || all {
			o.endStream(rc, send, err)
			return
		}
	}
}

// outputStep takes an update of choice c and returns what sends it: its text, then
// its end when it is done, each event after the token count line when the gateway
// asked for counts.
func (o *responder) outputStep(rc *http.ResponseController, send func(any) bool, c *choice, u update) func() bool {
	c.lps = append(c.lps, u.logprobs...)
	c.cached = u.cached
	text, done := u.text, u.done && u.err == nil
	counted := send
	if o.tokenCounts {
		count := runnerapi.TokenCountComment + " " + strconv.Itoa(c.index) + " " + strconv.Itoa(u.generated)
		counted = func(v any) bool {
			line := count
			if len(c.unsent) > 0 { // the first event after them names them
				line += " " + runnerapi.FormatTokenIDs(c.unsent)
				c.unsent = c.unsent[:0]
			}
			return o.sendEvent(rc, line+"\n", v)
		}
	}
	ids := u.ids
	return func() bool {
		if o.tokenCounts && o.tokenIDs {
			c.unsent = append(c.unsent, ids...)
		}
		if text != "" && !o.sendText(counted, c, text) {
			return false
		}
		return !done || o.sendEnd(counted, c)
	}
}

// startStream sends the status line and headers of an event stream and, for chat,
// each choice's role chunk; false when the client is gone.
func (o *responder) startStream(rc *http.ResponseController) bool {
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	o.w.WriteHeader(http.StatusOK)
	for _, c := range o.choices {
		if !o.chat {
			continue
		}
		// The role chunk carries no logprobs: they go with the output they are
		// of (a continued stream's role chunk is dropped by the gateway).
		chunk := runnerapi.ChatCompletionChunk{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.model,
			Choices: []runnerapi.ChatChunkChoice{{Index: c.index, Delta: runnerapi.ChatDelta{Role: "assistant", Content: ptr("")}}}}
		comment := ""
		if c.index == 0 {
			pu := o.promptUsage(c)
			if o.usageFirst {
				chunk.Usage = pu
			}
			if o.tokenCounts { // the gateway's, for a stream that breaks after its end
				comment = promptCount(pu)
			}
		}
		if !o.sendEvent(rc, comment, chunk) {
			return false
		}
	}
	return true
}

// endStream ends a started stream: with err, after the usage of what was generated
// before it (reported and metered too) when every choice had ended; else with the
// usage when asked for and [DONE].
func (o *responder) endStream(rc *http.ResponseController, send func(any) bool, err *runnerapi.Error) {
	if err != nil {
		if o.includeUsage && o.allEnded() && !o.sendUsage(send) {
			return
		}
		send(err)
		return
	}
	if o.includeUsage && !o.sendUsage(send) {
		return
	}
	if _, err := io.WriteString(o.w, "data: [DONE]\n\n"); err == nil {
		_ = rc.Flush()
	}
}

// sendEvent sends v as one event, its data line after comment (a line, or "").
func (o *responder) sendEvent(rc *http.ResponseController, comment string, v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	if _, err := fmt.Fprintf(o.w, "%sdata: %s\n\n", comment, b); err != nil {
		return false
	}
	return rc.Flush() == nil
}

// sendUsage sends the usage chunk: the prompt and every choice's generated tokens.
func (o *responder) sendUsage(send func(any) bool) bool {
	obj := "chat.completion.chunk"
	if !o.chat {
		obj = "text_completion"
	}
	return send(struct {
		ID      string           `json:"id"`
		Object  string           `json:"object"`
		Created int64            `json:"created"`
		Model   string           `json:"model"`
		Choices []struct{}       `json:"choices"`
		Usage   *runnerapi.Usage `json:"usage"`
	}{o.id, obj, o.created, o.model, []struct{}{}, o.usage()})
}

// allEnded reports whether every choice has its final update, so that usage counts
// each one's generated tokens.
func (o *responder) allEnded() bool {
	for _, c := range o.choices {
		if !c.done {
			return false
		}
	}
	return true
}

// sendEnd sends the end of a choice: what its parser still held, then the chunk with
// its finish reason.
func (o *responder) sendEnd(send func(any) bool, c *choice) bool {
	if o.chat && !o.sendDelta(send, c, c.parser.Finish()) {
		return false
	}
	finish := c.finishReason()
	if !o.chat {
		return send(runnerapi.Completion{ID: o.id, Object: "text_completion", Created: o.created, Model: o.model,
			Choices: []runnerapi.TextChoice{{Index: c.index, Text: "", Logprobs: o.textLogprobs(c, ""), FinishReason: &finish,
				StopSequence: c.last.stopSeq}}})
	}
	chunk := o.chatChunk(c, runnerapi.ChatDelta{}, &finish)
	chunk.Choices[0].StopSequence = c.last.stopSeq
	return send(chunk)
}

// sendText sends generated text: as is for a text completion, through the parser for
// a chat.
func (o *responder) sendText(send func(any) bool, c *choice, text string) bool {
	if !o.chat {
		return send(runnerapi.Completion{ID: o.id, Object: "text_completion", Created: o.created, Model: o.model,
			Choices: []runnerapi.TextChoice{{Index: c.index, Text: text, Logprobs: o.textLogprobs(c, text)}}})
	}
	return o.sendDelta(send, c, c.parser.Push(text))
}

func (o *responder) textLogprobs(c *choice, text string) *runnerapi.TextLogprobs {
	if !o.logprobs {
		return nil
	}
	lp := runnerapi.TextLogprobsOf(c.lps, c.offset)
	c.offset += len(text)
	c.lps = nil
	return lp
}

// sendDelta sends what the parser decided: reasoning, content, then each tool call as
// OpenAI streams them (a first chunk with id, type and name, then the arguments).
func (o *responder) sendDelta(send func(any) bool, c *choice, d chat.Delta) bool {
	if d.Reasoning != "" && !send(o.chatChunk(c, runnerapi.ChatDelta{ReasoningContent: &d.Reasoning}, nil)) {
		return false
	}
	if d.Content != "" && !send(o.chatChunk(c, runnerapi.ChatDelta{Content: &d.Content}, nil)) {
		return false
	}
	for _, tc := range d.ToolCalls {
		head := runnerapi.ToolCall{Index: tc.Index, ID: tc.ID, Type: tc.Type, Function: runnerapi.FunctionCall{Name: tc.Function.Name}}
		args := runnerapi.ToolCall{Index: tc.Index, Function: runnerapi.FunctionCall{Arguments: tc.Function.Arguments}}
		if !send(o.chatChunk(c, runnerapi.ChatDelta{ToolCalls: []runnerapi.ToolCall{head}}, nil)) ||
			!send(o.chatChunk(c, runnerapi.ChatDelta{ToolCalls: []runnerapi.ToolCall{args}}, nil)) {
			return false
		}
	}
	return true
}

// chatChunk is a chunk of choice c; it carries the logprobs produced since the last
// chunk that carried any.
func (o *responder) chatChunk(c *choice, d runnerapi.ChatDelta, finish *string) runnerapi.ChatCompletionChunk {
	ch := runnerapi.ChatChunkChoice{Index: c.index, Delta: d, FinishReason: finish}
	if o.logprobs && (len(c.lps) > 0 || finish != nil) {
		ch.Logprobs = &runnerapi.ChatLogprobs{Content: nonNil(c.lps), Refusal: []runnerapi.TokenLogprob{}}
		c.lps = nil
	}
	return runnerapi.ChatCompletionChunk{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.model,
		Choices: []runnerapi.ChatChunkChoice{ch}}
}

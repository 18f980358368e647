package splice

import (
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/macfleet/macfleet/gateway/metering"
)

// Outcomes of a broken stream (stream_continuations_total): continued, or why not.
const (
	Continued   = "continued"
	Limit       = "limit"       // it was continued as often as allowed
	Deadline    = "deadline"    // no replica took it in time
	Finished    = "finished"    // it had its finish_reason: nothing to continue
	ToolCall    = "tool_call"   // it broke in or after a tool call
	Reasoning   = "reasoning"   // a Responses stream had reasoning its continuation cannot name
	Unsupported = "unsupported" // a text completion, or n > 1 uncounted
	Refused     = "refused"     // a replica refused the continuation itself (a 400)
	Disabled    = "disabled"
)

// streamShape is what of a request decides whether its stream can be continued.
type streamShape struct {
	// n is its choices. (Output under a grammar, response_format, text.format or a
	// forced tool_choice, is continued: the continuing runner advances the grammar
	// past the text sent. A request that ends with an assistant's message, a Messages
	// request's own start of the answer, is continued: that message stays a closed
	// turn, as the first replica rendered it, before the open one.)
	n int
	// usage: a Chat Completions stream that asks for its usage chunk
	// (stream_options.include_usage), which a clean end writes (toolend.go).
	usage bool
}

// shapeOf reads the shape of a request body of api.
func shapeOf(api API, body []byte) streamShape {
	var req struct {
		N             *int `json:"n"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(body, &req)
	s := streamShape{n: 1}
	if api == Chat {
		if req.N != nil {
			s.n = *req.N
		}
		s.usage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	}
	return s
}

// Continuation is one broken stream's case for a continuation: the break, the stream,
// what its request asked, and how many times and until when it may be continued.
type Continuation struct {
	brk   *Break
	st    *Stream
	shape streamShape
	// max continuations per stream; deadline for a replica to take this one.
	max      int
	deadline time.Time
	// taken: this break was counted as one of the stream's continuations (a retry of
	// its continuation, or the next choice's with n > 1, is not another).
	taken bool
	// refusal is why a replica refused the continuation with a 400 (the text sent
	// does not follow the output's grammar, the template cannot leave the message
	// open): another replica would refuse it too.
	refusal string
}

// NewContinuation is the case of stream st, which brk broke, of a request with body:
// it may be continued max times, and waits for a replica until deadline. With n > 1
// its first choice to continue is the first that had not finished.
func NewContinuation(brk *Break, st *Stream, body []byte, max int, deadline time.Time) *Continuation {
	c := &Continuation{brk: brk, st: st, shape: shapeOf(st.api, body), max: max, deadline: deadline}
	c.st.n = c.shape.n
	if left := c.st.unfinished(); c.st.n > 1 && len(left) > 0 {
		c.st.choice = left[0]
	}
	return c
}

// Decide says whether the broken stream is continued now, and if not why (an outcome
// of stream_continuations_total).
func (c *Continuation) Decide(now time.Time) (bool, string) {
	switch {
	case c.max <= 0:
		return false, Disabled
	case c.refusal != "":
		return false, Refused
	case c.st.dropped:
		return false, TooLong
	case c.st.whole():
		return false, Finished
	case c.st.toolCalls:
		return false, ToolCall
	case c.st.strayItem:
		return false, Reasoning
	case c.shape.n > 1 && !c.st.tokens.known(), c.st.api == Completions:
		return false, Unsupported
	case !c.taken && c.st.continued >= c.max:
		return false, Limit
	case !now.Before(c.deadline):
		return false, Deadline
	}
	return true, Continued
}

// openAnswer is what a client has of the answer a continuation continues: its text,
// reasoning, and (Responses) the logprobs of its text.
type openAnswer struct {
	text, reasoning string
	logprobs        []json.RawMessage
}

// continuationBody is the request body of api with the answer already sent appended
// as the assistant's message: to a chat's or a Messages request's messages, to a
// Responses request's input (a string input becomes the user's message before it).
// The message carries the reasoning sent (assistantMessage; a Responses request's as a
// reasoning item right before it) and a Responses request's its text's logprobs (as
// its output_text part's); one: the continuation is of one choice of several (n is
// dropped).
func continuationBody(api API, body []byte, a openAnswer, one bool) ([]byte, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	if one {
		delete(req, "n")
	}
	field := "messages"
	if api == Responses {
		field = "input"
	}
	var msgs []json.RawMessage
	if api == Responses && len(req[field]) > 0 && req[field][0] == '"' {
		user, err := json.Marshal(map[string]json.RawMessage{"role": json.RawMessage(`"user"`), "content": req[field]})
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, user)
	} else if err := json.Unmarshal(req[field], &msgs); err != nil {
		return nil, fmt.Errorf("reading %s: %w", field, err)
	}
	if api == Responses && a.reasoning != "" { // the reasoning item before the message (resumedReasoning)
		rs, err := json.Marshal(map[string]any{"type": "reasoning", "summary": []any{},
			"content": []map[string]string{{"type": "reasoning_text", "text": a.reasoning}}})
		if err != nil {
			return nil, err
		}
		msgs, a.reasoning = append(msgs, rs), ""
	}
	m, err := assistantMessage(api, a)
	if err != nil {
		return nil, err
	}
	if req[field], err = json.Marshal(append(msgs, m)); err != nil {
		return nil, err
	}
	return json.Marshal(req)
}

// assistantMessage is the assistant's open message of a continuation of api: its text
// (with its logprobs, a Responses output_text part), and its reasoning as a chat's
// reasoning_content or a Messages thinking block before the text block.
func assistantMessage(api API, a openAnswer) ([]byte, error) {
	switch {
	case api == Messages && a.reasoning != "":
		blocks := []map[string]string{{"type": "thinking", "thinking": a.reasoning, "signature": ""}}
		if a.text != "" {
			blocks = append(blocks, map[string]string{"type": "text", "text": a.text})
		}
		return json.Marshal(map[string]any{"role": "assistant", "content": blocks})
	case api == Responses && len(a.logprobs) > 0:
		return json.Marshal(map[string]any{"role": "assistant", "content": []map[string]any{
			{"type": "output_text", "text": a.text, "annotations": []any{}, "logprobs": a.logprobs}}})
	}
	return json.Marshal(struct {
		Role      string `json:"role"`
		Content   string `json:"content"`
		Reasoning string `json:"reasoning_content,omitempty"`
	}{"assistant", a.text, a.reasoning})
}

// notContinued says to the client why its broken stream was not continued.
var notContinued = map[string]string{
	Limit:       "it was continued as often as the gateway allows (--stream-continuations)",
	Deadline:    "no other replica took it within --stream-continue-timeout",
	Finished:    "it had already finished",
	ToolCall:    "it broke in or after a tool call, whose arguments are not resumed: do not run the call",
	Reasoning:   "it had a second reasoning item or reasoning after its message, which a continuation cannot name",
	Unsupported: "text completions, and streams with n > 1 from a runner that does not count its tokens, are not continued",
	Refused:     "a replica refused to continue it",
}

// Reason is why the stream was not continued, as the client is told.
func (c *Continuation) Reason(why string) string {
	if why == Refused {
		return notContinued[why] + ": " + c.refusal
	}
	return notContinued[why]
}

// refusalOf is the message of a replica's error body (OpenAI's or Anthropic's shape),
// cut to a line's length.
func refusalOf(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := string(body)
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	if msg == "" {
		msg = "400 Bad Request"
	}
	if len(msg) > 300 {
		cut := 300
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return msg
}

// Stream is the stream the case is of.
func (c *Continuation) Stream() *Stream { return c.st }

// Break is how the stream last broke.
func (c *Continuation) Break() *Break { return c.brk }

// Deadline is when the case stops waiting for a replica.
func (c *Continuation) Deadline() time.Time { return c.deadline }

// Choice is the choice the continuation being written continues (0 with n = 1).
func (c *Continuation) Choice() int { return c.st.choice }

// Sent is the bytes of the continued choice's text the client has.
func (c *Continuation) Sent() int { return c.st.textOf(c.st.choice).Len() }

// Take counts this break as one of the stream's continuations, once: a retry of its
// continuation, or the next choice's with n > 1, is not another.
func (c *Continuation) Take() {
	if !c.taken {
		c.st.continued, c.taken = c.st.continued+1, true
	}
}

// Broke records that the continuation broke too, as brk says: its own case, which
// counts as another continuation once taken.
func (c *Continuation) Broke(brk *Break) { c.brk, c.taken = brk, false }

// Refused records a replica's refusal of the continuation (a 400 with body): another
// replica would refuse it too.
func (c *Continuation) Refused(body []byte) { c.refusal = refusalOf(body) }

// NextChoice points a stream with n > 1 at the next choice to continue, within this
// break's case, waiting for a replica until deadline; false when n is 1 or no choice
// is left.
func (c *Continuation) NextChoice(deadline time.Time) bool {
	if c.st.n <= 1 || !c.st.nextChoice() {
		return false
	}
	c.deadline = deadline
	return true
}

// Body is the request body of the continuation: the client's, body, with what the
// client has of the continued choice as the assistant's open message.
func (c *Continuation) Body(body []byte) ([]byte, error) {
	a := openAnswer{text: c.st.textOf(c.st.choice).String(), reasoning: c.st.thoughtOf(c.st.choice).String(), logprobs: c.st.logprobs}
	return continuationBody(c.st.api, body, a, c.st.n > 1)
}

// CountedUsage is the stream's usage by the gateway's counts (see countedUsage).
func (c *Continuation) CountedUsage() (metering.Usage, bool) { return c.st.countedUsage() }

// CleanEnd is the end of a Chat Completions stream that is not continued because it
// broke after a tool call or its finish_reason (see cleanEnd), with metered as its
// usage chunk when its request asked for one.
func (c *Continuation) CleanEnd(metered *metering.Usage) []byte {
	if !c.shape.usage {
		metered = nil
	}
	return c.st.cleanEnd(metered)
}

package splice

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
)

// A Chat Completions stream with n > 1 is continued one choice at a time: on a break,
// each choice that had not finished is sent to a replica in turn as its own
// continuation (n = 1, that choice's content as the assistant's open message, its
// own token count as runnerapi.HeaderContinuedTokens), and the continuation's chunks
// are the client's under that choice's index. Choices that had finished are left as
// they are. Every continuation but the last has its usage chunk and [DONE] dropped;
// the last one's usage chunk reports the completion tokens of every choice, as the
// gateway counted them (prompt tokens as the last continuing replica reports them).

// textOf is the content sent of choice i.
func (st *Stream) textOf(i int) *bytes.Buffer {
	if i <= 0 || i >= maxCountedChoices {
		return &st.text
	}
	for len(st.others) < i {
		st.others = append(st.others, bytes.Buffer{})
	}
	return &st.others[i-1]
}

// thoughtOf is the reasoning sent of choice i.
func (st *Stream) thoughtOf(i int) *bytes.Buffer {
	i = max(0, min(i, maxCountedChoices-1))
	for len(st.thoughts) <= i {
		st.thoughts = append(st.thoughts, bytes.Buffer{})
	}
	return &st.thoughts[i]
}

// end records choice i's finish_reason.
func (st *Stream) end(i int) {
	if i < 0 || i >= maxCountedChoices {
		return
	}
	for len(st.ended) <= i {
		st.ended = append(st.ended, false)
	}
	st.ended[i] = true
}

// unfinished is the choices of a stream with n > 1 that have no finish_reason yet.
func (st *Stream) unfinished() []int {
	var out []int
	for i := range min(st.n, maxCountedChoices) {
		if i >= len(st.ended) || !st.ended[i] {
			out = append(out, i)
		}
	}
	return out
}

// whole: the stream had everything it asks for: its finish_reason, or, with n > 1,
// every choice's.
func (st *Stream) whole() bool {
	if st.api == Chat && st.n > 1 {
		return len(st.unfinished()) == 0
	}
	return st.finished
}

// choiceChunk makes a chunk of a continuation of one choice of several (c, decoded
// from ev) the client's: its choice index becomes that choice's, and its usage chunk
// is dropped while other choices are still to be continued, or reports every
// choice's tokens when none is. keep false drops it.
func (s *Reader) choiceChunk(ev []byte, c *chunkHead) ([]byte, bool) {
	st := s.st
	if st.n <= 1 {
		return ev, true
	}
	if len(c.Choices) > 0 {
		for k := range c.Choices {
			c.Choices[k].Index = st.choice
		}
		return bytes.Replace(ev, []byte(`"choices":[{"index":0,`), []byte(`"choices":[{"index":`+strconv.Itoa(st.choice)+`,`), 1), true
	}
	if len(c.Usage) == 0 || string(c.Usage) == "null" {
		return ev, true
	}
	if left := st.unfinished(); len(left) > 1 || len(left) == 1 && left[0] != st.choice {
		return nil, false
	}
	return s.usageOfAll(ev, c)
}

// usageOfAll rewrites the last continuation's usage chunk to count every choice's
// completion tokens (the gateway's count, which a stream with n > 1 is only continued
// with).
func (s *Reader) usageOfAll(ev []byte, c *chunkHead) ([]byte, bool) {
	var u map[string]json.RawMessage
	if json.Unmarshal(c.Usage, &u) != nil {
		return ev, true
	}
	var prompt int64
	_ = json.Unmarshal(u["prompt_tokens"], &prompt)
	completion := s.st.tokens.total()
	u["completion_tokens"] = json.RawMessage(strconv.FormatInt(completion, 10))
	u["total_tokens"] = json.RawMessage(strconv.FormatInt(prompt+completion, 10))
	var chunk map[string]json.RawMessage
	if json.Unmarshal(sseData(ev), &chunk) != nil {
		return ev, true
	}
	var err error
	if chunk["usage"], err = json.Marshal(u); err != nil {
		return ev, true
	}
	data, err := json.Marshal(chunk)
	if err != nil {
		return ev, true
	}
	return append(append([]byte("data: "), data...), "\n\n"...), true
}

// SentTokens is what a continuation is told the client has of the answer it
// continues (runnerapi.HeaderContinuedTokens): the stream's tokens, or with n > 1 its
// choice's.
func (st *Stream) SentTokens() int64 {
	if st.n > 1 {
		return st.tokens.of(st.choice)
	}
	return st.tokens.total()
}

// SentTokenIDs is what a continuation is told the client's answer was generated as
// (runnerapi.HeaderContinuedTokenIDs): the ids of the stream's tokens, or with n > 1
// its choice's, as many of the first as fit in MaxContinuedTokenIDsBytes; "" when the
// runner did not name them all.
func (st *Stream) SentTokenIDs() string {
	s := runnerapi.FormatTokenIDs(st.tokens.idsOf(st.choice))
	if len(s) <= runnerapi.MaxContinuedTokenIDsBytes {
		return s
	}
	s = s[:runnerapi.MaxContinuedTokenIDsBytes+1]
	return s[:max(strings.LastIndexByte(s, ','), 0)]
}

// nextChoice points st at the next choice of a stream with n > 1 to continue, after
// the one whose continuation just ended (which counts as finished: its replica ended
// it); ok false when none is left.
func (st *Stream) nextChoice() bool {
	st.end(st.choice)
	st.tokens.broke()
	left := st.unfinished()
	if len(left) == 0 {
		return false
	}
	st.choice = left[0]
	return true
}

// ChoiceUsage adjusts the usage report u of a continuation of one choice of several
// (body is its splice reader): false while other choices are still to be continued
// (it is metered with the last one), and the last one's counts every choice's
// completion tokens, as the gateway counted them, within bound.
func ChoiceUsage(body io.Reader, u *metering.Usage, bound metering.Usage) bool {
	sr, ok := body.(*Reader)
	if !ok || !sr.cont || sr.st.n <= 1 {
		return true
	}
	if left := sr.st.unfinished(); len(left) > 1 || len(left) == 1 && left[0] != sr.st.choice {
		return false
	}
	u.Output = min(sr.st.tokens.total(), bound.Output)
	return true
}

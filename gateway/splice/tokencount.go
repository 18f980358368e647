package splice

import (
	"bytes"
	"io"
	"strconv"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
)

// maxCountedChoices bounds the choices a stream's count keeps apart (n is at most 128).
const maxCountedChoices = 128

// tokenCount is the gateway's own count of the completion tokens of a Chat Completions
// stream it forwarded: the runner puts each choice's tokens so far before each event
// with output (runnerapi.HeaderTokenCounts), and the last count of each choice the
// client got is what it was sent. A continued stream's count adds up its replicas'.
type tokenCount struct {
	// before: the tokens the replicas before the one writing now sent, per choice;
	// choices: that one's, per choice, as of its last event forwarded.
	before  []int64
	choices []int64
	// seen: an event carried a count; bad: a count was not one (the count is not
	// used).
	seen, bad bool
	// ids are each choice's tokens, from every replica, as the count lines named
	// them (runnerapi.HeaderTokenIDs); idsOff: a choice's lines missed some, or named
	// some that are not ids (its ids are not told to a continuation).
	ids    [][]int32
	idsOff []bool
}

// read takes one count line's value, "I N" or "I N IDS": choice I has N tokens so
// far, the last of them IDS. The stream's choice I is the client's choice I + at (a
// continuation of one choice of several writes it as its choice 0).
func (c *tokenCount) read(v []byte, at int) {
	c.seen = true
	is, rest, ok := bytes.Cut(bytes.TrimRight(v, "\r"), []byte(" "))
	ns, ids, _ := bytes.Cut(rest, []byte(" "))
	i, ierr := strconv.Atoi(string(is))
	n, nerr := strconv.ParseInt(string(ns), 10, 64)
	i += at
	if !ok || ierr != nil || nerr != nil || i < 0 || i >= maxCountedChoices || n < 0 {
		c.bad = true
		return
	}
	for len(c.choices) <= i {
		c.choices = append(c.choices, 0)
	}
	if n < c.choices[i] { // a count goes only up
		c.bad = true
		return
	}
	c.readIDs(i, c.choices[i], n, ids)
	c.choices[i] = n
}

// readIDs takes the ids of choice i's tokens from the replica's count from to its
// count n: the count line's IDS, which must be exactly those tokens.
func (c *tokenCount) readIDs(i int, from, n int64, ids []byte) {
	for len(c.ids) <= i {
		c.ids, c.idsOff = append(c.ids, nil), append(c.idsOff, false)
	}
	if c.idsOff[i] || n == from && len(ids) == 0 {
		return
	}
	got, err := runnerapi.ParseTokenIDs(string(ids))
	if err != nil || int64(len(got)) != n-from {
		c.ids[i], c.idsOff[i] = nil, true
		return
	}
	c.ids[i] = append(c.ids[i], got...)
}

// idsOf is the ids of choice i's tokens, from every replica, when the count lines
// named every one (nil when not).
func (c *tokenCount) idsOf(i int) []int32 {
	if i < 0 || i >= len(c.ids) || c.idsOff[i] {
		return nil
	}
	return c.ids[i]
}

// idsKept is the bytes the ids take.
func (c *tokenCount) idsKept() int {
	n := 0
	for _, ids := range c.ids {
		n += 4 * len(ids)
	}
	return n
}

// total is the count: every replica's tokens sent, of every choice.
func (c *tokenCount) total() int64 {
	var t int64
	for _, n := range c.before {
		t += n
	}
	for _, n := range c.choices {
		t += n
	}
	return t
}

// of is the count of choice i: every replica's tokens sent of it.
func (c *tokenCount) of(i int) int64 {
	var t int64
	if i < len(c.before) {
		t += c.before[i]
	}
	if i < len(c.choices) {
		t += c.choices[i]
	}
	return t
}

// broke closes the count of the replica that ended its part of the stream (it failed,
// or it wrote one choice's continuation): the next one counts from 0.
func (c *tokenCount) broke() {
	for len(c.before) < len(c.choices) {
		c.before = append(c.before, 0)
	}
	for i, n := range c.choices {
		c.before[i] += n
	}
	c.choices = c.choices[:0]
}

// known: the count can be told to a continuation and held against a usage report.
func (c *tokenCount) known() bool { return c.seen && !c.bad }

// promptCount is the prompt's usage a replica reported on its stream's first event
// (runnerapi.PromptCountComment): its tokens, and those found in the prompt cache.
type promptCount struct {
	tokens, cached int64
	known          bool
}

// read takes the line's value, "P C"; a value that is not one leaves the prompt unknown.
func (p *promptCount) read(v []byte) {
	ps, cs, ok := bytes.Cut(bytes.TrimRight(v, "\r"), []byte(" "))
	n, nerr := strconv.ParseInt(string(ps), 10, 64)
	c, cerr := strconv.ParseInt(string(cs), 10, 64)
	if !ok || nerr != nil || cerr != nil || n < 0 || c < 0 || c > n {
		*p = promptCount{}
		return
	}
	*p = promptCount{tokens: n, cached: c, known: true}
}

// Counted is the gateway's count of the completion tokens in the stream body (a
// Reader) read: the stream's, or a continuation of one choice of several's, that
// choice's (what its replica reports as its usage); ok false when body is not a Reader
// or the count is not known.
func Counted(body io.Reader) (int64, bool) {
	sr, ok := body.(*Reader)
	if !ok || !sr.st.tokens.known() {
		return 0, false
	}
	if sr.cont && sr.st.n > 1 {
		return sr.st.tokens.of(sr.st.choice), true
	}
	return sr.st.tokens.total(), true
}

// RelayedUsage is the usage of a stream that ended without its replica's report (it
// broke and was not continued, or its client went away and the answer was dropped
// before its end), by the gateway's own counts: every completion token it read of
// every choice, from every replica, and the prompt as its last replica reported it (0
// when none did); ok false when the runner sent no token count, or one that was not
// one.
func (st *Stream) RelayedUsage() (metering.Usage, bool) {
	if !st.tokens.known() {
		return metering.Usage{}, false
	}
	u := metering.Usage{Output: st.tokens.total()}
	if st.prompt.known {
		u.Input, u.Cached = st.prompt.tokens, st.prompt.cached
	}
	return u, true
}

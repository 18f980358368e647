package gateway

import (
	"bytes"
	"io"
	"strconv"

	"github.com/macfleet/macfleet/gateway/metering"
)

// maxCountedChoices bounds the choices a stream's count keeps apart (n is at most 128).
const maxCountedChoices = 128

// tokenCount is the gateway's own count of the completion tokens of a Chat Completions
// stream it forwarded: the runner puts each choice's tokens so far before each event
// with output (runnerapi.HeaderTokenCounts), and the last count of each choice the
// client got is what it was sent. A continued stream's count adds up its replicas'.
type tokenCount struct {
	// before: the tokens the replicas before the one writing now sent; choices: that
	// one's, per choice, as of its last event forwarded.
	before  int64
	choices []int64
	// seen: an event carried a count; bad: a count was not one (the count is not
	// used).
	seen, bad bool
}

// read takes one count line's value, "I N": choice I has N tokens so far.
func (c *tokenCount) read(v []byte) {
	c.seen = true
	is, ns, ok := bytes.Cut(bytes.TrimRight(v, "\r"), []byte(" "))
	i, ierr := strconv.Atoi(string(is))
	n, nerr := strconv.ParseInt(string(ns), 10, 64)
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
	c.choices[i] = n
}

// total is the count: every replica's tokens sent.
func (c *tokenCount) total() int64 {
	t := c.before
	for _, n := range c.choices {
		t += n
	}
	return t
}

// broke closes the count of the replica that failed: a continuation counts from 0.
func (c *tokenCount) broke() {
	c.before = c.total()
	c.choices = c.choices[:0]
}

// known: the count can be told to a continuation and held against a usage report.
func (c *tokenCount) known() bool { return c.seen && !c.bad }

// checkCount holds a stream's usage report u against the gateway's own count of the
// tokens it forwarded (body is the stream's splice reader): a report of other
// completion tokens is counted in usage_count_disagreements_total and logged as
// distrusted. The report stays what is metered, within its bound.
func (g *Gateway) checkCount(model string, be Backend, body io.Reader, u *metering.Usage) {
	sr, ok := body.(*spliceReader)
	if !ok || u == nil || !sr.st.tokens.known() || sr.st.tokens.total() == u.Output {
		return
	}
	g.metrics.countDisagreements.WithLabelValues(model).Inc()
	g.distrusted(model, be, "A replica reported other completion tokens than the gateway counted in its stream",
		"reported", u.Output, "counted", sr.st.tokens.total())
}

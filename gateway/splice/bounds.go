package splice

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Bounds. A replica chooses what it streams, so what the gateway holds of a stream
// is bounded: one event at most MaxEventBytes (a longer one breaks the stream, as a
// replica failure, with cause "event_too_large"), and the answer it keeps to continue
// the stream elsewhere (every choice's text and reasoning, tool calls' arguments,
// logprobs, each choice's token ids) at most MaxKeptBytes. Past that, what was kept is let go and the stream is
// no longer continued (outcome TooLong); it is still relayed and counted.
const (
	MaxEventBytes = 4 << 20
	MaxKeptBytes  = 8 << 20
)

// boundEvery is how many bytes of events the Reader takes between two checks of what
// its stream keeps (Stream.bound): what is kept grows by at most what was taken, so
// it never passes MaxKeptBytes by more.
const boundEvery = 64 << 10

// TooLong is the outcome of a broken stream whose kept answer passed MaxKeptBytes.
const TooLong = "too_long"

// errEventTooLarge is the break of a stream whose event passed MaxEventBytes.
func errEventTooLarge() *Break {
	return &Break{cause: "event_too_large", err: fmt.Errorf("an event over %d bytes", MaxEventBytes)}
}

// Kept is the bytes st holds of its answer to continue it.
func (st *Stream) Kept() int {
	n := st.text.Len()
	for i := range st.others {
		n += st.others[i].Len()
	}
	for i := range st.thoughts {
		n += st.thoughts[i].Len()
	}
	for _, a := range st.args {
		n += len(a)
	}
	for _, l := range st.logprobs {
		n += len(l)
	}
	return n + st.tokens.idsKept()
}

// bound lets go of what st keeps once it passes MaxKeptBytes: the stream is then
// not continued (dropped).
func (st *Stream) bound() {
	if !st.dropped && st.Kept() <= MaxKeptBytes {
		return
	}
	st.dropped = true
	st.text = bytes.Buffer{}
	st.others, st.thoughts = nil, nil
	st.args, st.logprobs = nil, []json.RawMessage(nil)
	st.tokens.ids, st.tokens.idsOff = nil, nil
}

// Dropped: the stream kept more than MaxKeptBytes and let it go.
func (st *Stream) Dropped() bool { return st.dropped }

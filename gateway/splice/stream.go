// Package splice owns what the gateway knows of a stream it may continue on another
// replica (docs/fleet.md, "Continuing a broken stream"): a Stream is what its client
// has been sent, across the replicas that wrote it; a Reader reads one replica's part
// event by event, splicing a continuation's into the client's stream, and ends with a
// *Break when the replica fails after the first byte; a Continuation is one break's
// case for being continued: whether it is (Decide), the request body that continues
// it, and the clean end of a stream that is not. The gateway picks the replicas, sends
// the requests and writes the answers; it reads and changes a stream only here.
package splice

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// countPrefix starts the line of the runner's count before an event's data, and
// promptCountPrefix its line of the prompt's usage before its first event
// (runnerapi.HeaderTokenCounts).
var (
	countPrefix       = []byte(runnerapi.TokenCountComment + " ")
	promptCountPrefix = []byte(runnerapi.PromptCountComment + " ")
)

// DoneEvent is the last event of an OpenAI stream.
const DoneEvent = "data: [DONE]\n\n"

// Stream is what the gateway knows of one stream it may continue on another replica
// (continuation.go): what its client has been sent so far, across the replicas that
// wrote it.
type Stream struct {
	api API
	// id and created are the stream's, from its first chunk: a continuation's chunks
	// are rewritten to carry them. A Responses stream's id, created_at, next
	// sequence_number and message item, and a Messages stream's id and text block
	// (index, and whether it is open), are told to its continuation instead
	// (ResumeHeader).
	id        string
	created   []byte
	createdAt int64
	seq       int
	item      string
	index     int
	blockOpen bool
	// text is the assistant's content sent so far (choice 0's, with n > 1), and
	// logprobs a Responses stream's logprobs of it (as its deltas carried them).
	text     bytes.Buffer
	logprobs []json.RawMessage
	// n is the choices the request asked for; with n > 1, others is the content sent
	// of each choice after the first, ended which choices had their finish_reason, and
	// choice the one the continuation being written now continues (choices.go).
	n      int
	others []bytes.Buffer
	ended  []bool
	choice int
	// thoughts is each choice's reasoning sent (reasoning_content; a Messages
	// stream's thinking), which a continuation sends back with the text; thinking:
	// a Messages stream's open block is its thinking block.
	thoughts []bytes.Buffer
	thinking bool
	// rsItem is a Responses stream's reasoning item (output index 0, before its
	// message item), and rsOpen whether the client has not had its done events.
	rsItem string
	rsOpen bool
	// strayItem, toolCalls and finished: the stream sent reasoning its continuation
	// cannot name (a Responses stream's second reasoning item, or one after its
	// message), a tool call, or a finish_reason (the answer cannot be continued as
	// text).
	strayItem, toolCalls, finished bool
	// model is the stream's model; args each tool call's arguments sent (toolend.go).
	model string
	args  [][]byte
	// broke: a replica failed the stream; the next attempt continues it. brokeOn are
	// the replicas it broke on, which its continuations never fetch state from.
	broke   bool
	brokeOn []string
	// continued counts the continuations that started streaming.
	continued int
	// held is the error event the broken replica ended with, sent to the client only
	// when the stream is not continued.
	held []byte
	// tokens is the gateway's count of the completion tokens it forwarded; prompt the
	// prompt's usage as the replica writing the stream (the last one) reported it.
	tokens tokenCount
	prompt promptCount
	// dropped: what was kept passed MaxKeptBytes and was let go (bounds.go).
	dropped bool
}

// New is the record of a stream of api that nothing was sent of yet.
func New(api API) *Stream { return &Stream{api: api} }

// API is the stream's API.
func (st *Stream) API() API { return st.api }

// Broken: a replica failed the stream; the next attempt continues it.
func (st *Stream) Broken() bool { return st.broke }

// BrokeOn are the replicas the stream broke on, which its continuations never fetch
// state from.
func (st *Stream) BrokeOn() []string { return st.brokeOn }

// Broke records that replica failed the stream after its first byte: the next
// attempt continues it, and the replica's part of the token count is closed.
func (st *Stream) Broke(replica string) {
	st.broke, st.brokeOn = true, append(st.brokeOn, replica)
	st.tokens.broke()
}

// TokensKnown: the gateway's count of the tokens sent can be told to a continuation.
func (st *Stream) TokensKnown() bool { return st.tokens.known() }

// Continued counts the continuations that started streaming.
func (st *Stream) Continued() int { return st.continued }

// HeldError is the data of the error event the broken replica ended with, held back
// from the client (nil when none was).
func (st *Stream) HeldError() []byte {
	if len(st.held) == 0 {
		return nil
	}
	return sseData(st.held)
}

// Break is how a stream's replica failed after its first byte: the error a
// splice reader returns instead of the rest of the stream.
type Break struct {
	// cause: error_event (the agent reported the replica's failure in the stream),
	// eof (the stream ended without [DONE]) or transport (reading it failed).
	cause string
	err   error
}

func (b *Break) Error() string {
	if b.err != nil {
		return b.err.Error()
	}
	return "the stream ended without [DONE]"
}

func (b *Break) Unwrap() error { return b.err }

// Cause is how the replica failed: error_event, eof or transport.
func (b *Break) Cause() string { return b.cause }

// Reader reads a replica's Chat Completions stream for the client event by
// event, recording what it carries in st. A replica failure after the first byte (a
// server-side error event, EOF before [DONE], a read error) is a *Break, and
// its error event is held back. On a continuation (cont) the replica's role chunk is
// dropped (the client has had it) and each chunk carries the stream's id and
// created instead of the continuation's.
type Reader struct {
	br      *bufio.Reader
	body    io.Closer
	st      *Stream
	cont    bool
	pending []byte // what of out the client has not read yet
	out     []byte
	event   []byte
	done    bool
	// from is the continuation's own `"id":"…"` and `"created":…`, to replace.
	fromID, fromCreated []byte
	// unbounded is the bytes of events taken since the stream's kept answer was last
	// held to MaxKeptBytes (bounds.go).
	unbounded int
}

// NewReader reads body, a replica's stream of st; cont: it continues st (see Reader).
func NewReader(body io.ReadCloser, st *Stream, cont bool) *Reader {
	return &Reader{br: bufio.NewReaderSize(body, 32<<10), body: body, st: st, cont: cont}
}

// Stream is the stream the reader records.
func (s *Reader) Stream() *Stream { return s.st }

func (s *Reader) Close() error { return s.body.Close() }

func (s *Reader) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		if err := s.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

// next reads one event into pending (nothing, for a dropped one).
func (s *Reader) next() error {
	s.event = s.event[:0]
	for {
		line, err := s.br.ReadSlice('\n')
		if len(s.event)+len(line) > MaxEventBytes {
			return errEventTooLarge()
		}
		s.event = append(s.event, line...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if s.done && len(bytes.TrimSpace(s.event)) == 0 {
				return err // io.EOF after [DONE]: the stream's end
			}
			if err == io.EOF {
				return &Break{cause: "eof"}
			}
			return &Break{cause: "transport", err: err}
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			break
		}
	}
	for { // the runner's counts, for the gateway only
		if rest, ok := bytes.CutPrefix(s.event, countPrefix); ok {
			i := bytes.IndexByte(rest, '\n')
			at := 0
			if s.cont {
				at = s.st.choice
			}
			s.st.tokens.read(rest[:i], at)
			s.event = s.event[:copy(s.event, rest[i+1:])]
		} else if rest, ok := bytes.CutPrefix(s.event, promptCountPrefix); ok {
			i := bytes.IndexByte(rest, '\n')
			s.st.prompt.read(rest[:i])
			s.event = s.event[:copy(s.event, rest[i+1:])]
		} else {
			return s.take(s.event)
		}
	}
}

// take handles one whole event.
func (s *Reader) take(ev []byte) error {
	data := sseData(ev)
	switch {
	case s.st.api == Responses || s.st.api == Messages: // apis.go
		take := s.takeResponses
		if s.st.api == Messages {
			take = s.takeMessages
		}
		if keep, err := take(ev, data); err != nil || !keep {
			return err
		}
	case bytes.Equal(data, []byte("[DONE]")):
		s.done = true
		if s.cont && s.st.n > 1 && len(s.st.unfinished()) > 0 {
			return nil // one choice's continuation: the stream goes on with the next
		}
	case bytes.HasPrefix(data, []byte(`{"error"`)):
		var e struct {
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		if replicaFailure(e.Error.Type) {
			s.st.held = append(s.st.held[:0], ev...)
			return &Break{cause: "error_event", err: errors.New(string(data))}
		}
		s.done = true // the stream's own end, as the replica chose it
	case len(data) > 0 && s.st.api == Chat:
		var keep bool
		if ev, keep = s.chunk(ev, data); !keep {
			return nil
		}
	}
	if s.unbounded += len(ev); s.unbounded >= boundEvery {
		s.st.bound()
		s.unbounded = 0
	}
	s.out = append(s.out[:0], ev...)
	s.pending = s.out
	return nil
}

// replicaFailure: an in-stream error of this type is the replica's failure, not the
// request's (which another replica would refuse too).
func replicaFailure(typ string) bool {
	return typ == "server_error" || typ == "service_unavailable"
}

// chunkHead is what the gateway reads of a Chat Completions chunk.
type chunkHead struct {
	ID      string          `json:"id"`
	Created json.RawMessage `json:"created"`
	Model   string          `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role             string          `json:"role"`
			Content          *string         `json:"content"`
			ReasoningContent *string         `json:"reasoning_content"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage json.RawMessage `json:"usage"`
}

// contentOnly reads the content of the usual chunk — choice 0's content delta, no
// role, reasoning, tool call or finish — without decoding the whole chunk; ok false
// for any other.
func contentOnly(data []byte) (text []byte, ok bool) {
	const key = `"content":"`
	i := bytes.Index(data, []byte(key))
	if i < 0 || !bytes.Contains(data, []byte(`"finish_reason":null`)) || bytes.Contains(data, []byte(`"role"`)) ||
		!bytes.Contains(data[:i], []byte(`"choices":[{"index":0,`)) ||
		bytes.Contains(data, []byte(`"tool_calls"`)) || bytes.Contains(data, []byte(`"reasoning_content"`)) ||
		bytes.Contains(data[i+len(key):], []byte(key)) {
		return nil, false
	}
	lit := data[i+len(key)-1:] // from the opening quote
	escaped := false
	for j := 1; j < len(lit); j++ {
		switch lit[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			if !escaped {
				return lit[1:j], true
			}
			var t string
			if json.Unmarshal(lit[:j+1], &t) != nil {
				return nil, false
			}
			return []byte(t), true
		}
	}
	return nil, false
}

// chunk records a chunk and returns it as the client gets it; keep false drops it.
func (s *Reader) chunk(ev, data []byte) ([]byte, bool) {
	if s.st.id != "" && !s.cont {
		if text, ok := contentOnly(data); ok {
			s.st.text.Write(text)
			return ev, true
		}
	}
	var c chunkHead
	if json.Unmarshal(data, &c) != nil {
		return ev, true // not a chunk the gateway knows: passed on as it came
	}
	st := s.st
	if st.id == "" { // the stream's first chunk (a continuation's, if none came before)
		st.id, st.created, st.model = c.ID, append([]byte(nil), c.Created...), c.Model
		s.cont = false
	}
	if s.cont {
		if s.fromID == nil {
			s.fromID = []byte(`"id":` + strconv.Quote(c.ID))
			s.fromCreated = append([]byte(`"created":`), c.Created...)
		}
		if len(c.Choices) == 1 && c.Choices[0].Delta.Role != "" {
			return nil, false // the continuation's role chunk: the client has the stream's
		}
		ev = bytes.Replace(ev, s.fromID, []byte(`"id":`+strconv.Quote(st.id)), 1)
		ev = bytes.Replace(ev, s.fromCreated, append([]byte(`"created":`), st.created...), 1)
		var keep bool
		if ev, keep = s.choiceChunk(ev, &c); !keep {
			return nil, false
		}
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		if d.Content != nil {
			st.textOf(ch.Index).WriteString(*d.Content)
		}
		if ch.FinishReason != nil {
			st.end(ch.Index)
		}
		if d.ReasoningContent != nil && *d.ReasoningContent != "" {
			st.thoughtOf(ch.Index).WriteString(*d.ReasoningContent)
		}
		if len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null" {
			st.toolCalls = true
			st.addToolCalls(d.ToolCalls)
		}
		st.finished = st.finished || ch.FinishReason != nil
	}
	return ev, true
}

// sseData is the payload of an event's data lines.
func sseData(ev []byte) []byte {
	// The agent sends one data line per event: taken without copying.
	if v, ok := bytes.CutPrefix(ev, []byte("data: ")); ok {
		if i := bytes.IndexByte(v, '\n'); i >= 0 && len(bytes.TrimSpace(v[i:])) == 0 {
			return bytes.TrimRight(v[:i], "\r")
		}
	}
	var data []byte
	for _, line := range bytes.Split(ev, []byte("\n")) {
		v, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:"))
		if !ok {
			continue
		}
		if data != nil {
			data = append(data, '\n')
		}
		data = append(data, bytes.TrimPrefix(v, []byte(" "))...)
	}
	return data
}

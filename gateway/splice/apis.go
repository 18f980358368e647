package splice

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// The APIs whose streams the gateway reads event by event (stream.go): Chat
// Completions chunks (and text completions', only counted), and the Responses and Anthropic Messages events that the node
// agent translates from them. A continuation of the latter two is translated on from
// where the client's stream stands (runnerapi.HeaderResumeStream), so its events are
// passed on as they come; the gateway reads them for the text sent and the stream's
// end.
type API int

const (
	Chat API = iota
	Responses
	Messages
	// Completions: a text completion's stream is counted, not continued.
	Completions
)

// APIOf is the stream API of a request path; ok false for one that is not read.
func APIOf(path string) (API, bool) {
	switch path {
	case "/v1/chat/completions":
		return Chat, true
	case "/v1/responses":
		return Responses, true
	case "/v1/messages":
		return Messages, true
	case "/v1/completions":
		return Completions, true
	}
	return 0, false
}

// responsesEvent is what the gateway reads of a Responses stream event.
type responsesEvent struct {
	Type     string `json:"type"`
	Seq      *int   `json:"sequence_number"`
	Response *struct {
		ID        string `json:"id"`
		CreatedAt int64  `json:"created_at"`
	} `json:"response"`
	Item *struct {
		ID   string `json:"id"`
		Type string `json:"type"`
	} `json:"item"`
	ItemID   string            `json:"item_id"`
	Delta    string            `json:"delta"`
	Logprobs []json.RawMessage `json:"logprobs"`
}

// takeResponses records a Responses event. An error event is held, and so is the
// response.failed after it: together they are the replica's failure, sent to the
// client only when the stream is not continued. keep false drops the event.
func (s *Reader) takeResponses(ev, data []byte) (keep bool, err error) {
	var e responsesEvent
	if json.Unmarshal(data, &e) != nil {
		return true, nil
	}
	st := s.st
	if e.Seq != nil && e.Type != "error" && (e.Type != "response.failed" || len(st.held) == 0) {
		st.seq = *e.Seq + 1 // the next one the client gets (held events are not sent)
	}
	switch e.Type {
	case "response.created":
		if e.Response != nil {
			st.id, st.createdAt = e.Response.ID, e.Response.CreatedAt
		}
	case "response.output_item.added":
		switch {
		case e.Item == nil:
		case e.Item.Type == "message" && st.item == "":
			st.item = e.Item.ID
		case e.Item.Type == "reasoning" && st.item == "" && st.rsItem == "":
			st.rsItem, st.rsOpen = e.Item.ID, true
		case e.Item.Type == "reasoning": // a second one, or one after the message
			st.strayItem = true
		default: // a function call, or an item after the message
			st.toolCalls = true
		}
	case "response.reasoning_text.delta":
		if e.ItemID == st.rsItem {
			st.thoughtOf(0).WriteString(e.Delta)
		}
	case "response.output_text.delta":
		st.text.WriteString(e.Delta)
		st.logprobs = append(st.logprobs, e.Logprobs...)
	case "response.reasoning_text.done":
	case "response.content_part.done", "response.output_item.done":
		if st.rsItem != "" && (e.ItemID == st.rsItem || e.Item != nil && e.Item.ID == st.rsItem) {
			st.rsOpen = false // the reasoning is closed; the message may follow
			break
		}
		st.finished = true // the message is closed: nothing to continue as text
	case "response.output_text.done":
		st.finished = true
	case "response.completed", "response.incomplete":
		st.finished, s.done = true, true
	case "error":
		st.held = append(st.held[:0], ev...)
		return false, nil
	case "response.failed":
		if len(st.held) > 0 {
			st.held = append(st.held, ev...)
			return false, &Break{cause: "error_event", err: errors.New(string(sseData(st.held)))}
		}
		st.finished, s.done = true, true
	}
	return true, nil
}

// messagesEvent is what the gateway reads of an Anthropic Messages stream event.
type messagesEvent struct {
	Type    string `json:"type"`
	Message *struct {
		ID string `json:"id"`
	} `json:"message"`
	Index        *int `json:"index"`
	ContentBlock *struct {
		Type string `json:"type"`
	} `json:"content_block"`
	Delta *struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		Thinking string `json:"thinking"`
	} `json:"delta"`
	Error *struct {
		Type string `json:"type"`
	} `json:"error"`
}

// takeMessages records a Messages event. An error event of the replica's (api_error,
// overloaded_error) is held. A thinking block (the answer's reasoning, which comes
// first) is recorded as the open block while it is open; after it the next block's
// index is the one a continuation opens.
func (s *Reader) takeMessages(ev, data []byte) (keep bool, err error) {
	var e messagesEvent
	if json.Unmarshal(data, &e) != nil {
		return true, nil
	}
	st := s.st
	switch e.Type {
	case "message_start":
		if e.Message != nil {
			st.id = e.Message.ID
		}
	case "content_block_start":
		switch {
		case e.ContentBlock == nil || e.Index == nil:
		case e.ContentBlock.Type == "text":
			st.index, st.blockOpen, st.thinking = *e.Index, true, false
		case e.ContentBlock.Type == "thinking":
			st.index, st.blockOpen, st.thinking = *e.Index, true, true
		default: // a tool use
			st.toolCalls = true
		}
	case "content_block_delta":
		switch {
		case e.Delta == nil:
		case e.Delta.Type == "text_delta":
			st.text.WriteString(e.Delta.Text)
		case e.Delta.Type == "thinking_delta":
			st.thoughtOf(0).WriteString(e.Delta.Thinking)
		}
	case "content_block_stop":
		if st.thinking && st.blockOpen {
			st.index, st.blockOpen, st.thinking = st.index+1, false, false
			break
		}
		st.finished = true
	case "message_delta":
		st.finished = true
	case "message_stop":
		st.finished, s.done = true, true
	case "error":
		if e.Error != nil && (e.Error.Type == "api_error" || e.Error.Type == "overloaded_error") {
			st.held = append(st.held[:0], ev...)
			return false, &Break{cause: "error_event", err: errors.New(string(data))}
		}
		s.done = true // the request's own error, as the replica chose to end with it
	}
	return true, nil
}

// ResumeHeader is runnerapi.HeaderResumeStream for a continuation of st ("" for a
// Chat Completions stream, or one that sent nothing yet: its continuation's stream is
// the client's).
func (st *Stream) ResumeHeader() string {
	if st.api == Chat || st.id == "" {
		return ""
	}
	rs := runnerapi.ResumeStream{ID: st.id, CreatedAt: st.createdAt, Seq: st.seq, Item: st.item, Reasoning: st.rsItem,
		ReasoningOpen: st.rsOpen && st.item == ""}
	if st.api == Messages {
		rs = runnerapi.ResumeStream{Index: st.index, Open: st.blockOpen}
	}
	b, _ := json.Marshal(rs)
	return string(b)
}

// BrokenEvent is the last event of a Responses or Messages stream that broke and is
// not continued: the replica's held error events, or the gateway's error saying msg.
func (st *Stream) BrokenEvent(msg string) []byte {
	if len(st.held) > 0 {
		return st.held
	}
	var v any
	if st.api == Responses {
		v = map[string]any{"type": "error", "code": "upstream_error", "message": msg, "param": nil, "sequence_number": st.seq}
	} else {
		v = map[string]any{"type": "error", "error": map[string]any{"type": "api_error", "message": msg}}
	}
	b, _ := json.Marshal(v)
	return fmt.Appendf(nil, "event: error\ndata: %s\n\n", b)
}

package translate

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// Resuming a stream (runnerapi.HeaderResumeStream): the gateway continues a Responses
// or Messages stream whose replica failed on another replica, with the text its client
// has as the final assistant message. The translation then goes on with the client's
// stream instead of starting one: its ids and sequence numbers, its open text item or
// block, and the text already sent at the start of that item's text.

// resumeOf is the stream a request continues: ok only with runnerapi.HeaderContinue
// and a readable runnerapi.HeaderResumeStream.
func resumeOf(r *http.Request) (rs runnerapi.ResumeStream, ok bool) {
	v := r.Header.Get(runnerapi.HeaderResumeStream)
	if v == "" || r.Header.Get(runnerapi.HeaderContinue) != runnerapi.ContinueFinalMessage {
		return rs, false
	}
	return rs, json.Unmarshal([]byte(v), &rs) == nil && rs.Index >= 0 && rs.Seq >= 0
}

// continuedText is the final assistant message of a translated chat request: the text
// the client of a resumed stream has.
func continuedText(chat map[string]any) string {
	msgs, _ := chat["messages"].([]runnerapi.Message)
	if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
		return string(msgs[n-1].Content)
	}
	return ""
}

// continuedReasoning is the reasoning of the final assistant message of a translated
// chat request: what the client of a resumed stream has of its reasoning item.
func continuedReasoning(chat map[string]any) string {
	msgs, _ := chat["messages"].([]runnerapi.Message)
	if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
		return msgs[n-1].ReasoningContent
	}
	return ""
}

// resume makes s go on with the Responses stream rs: started, its reasoning item
// (output index 0) with reasoning when it has one, open while it has no message
// item, and its message item (after it) open with text when it has one. The items
// it opens next are numbered after them, as in the stream it goes on with.
func (s *responseState) resume(rs runnerapi.ResumeStream, text, reasoning string) {
	s.started, s.id, s.created, s.seq = true, rs.ID, rs.CreatedAt, rs.Seq
	if rs.Reasoning != "" {
		if rs.ReasoningOpen && rs.Item == "" {
			s.open = "reasoning"
			s.output = append(s.output, reasoningItem(rs.Reasoning, "", "in_progress"))
			s.text.WriteString(reasoning)
		} else {
			s.output = append(s.output, reasoningItem(rs.Reasoning, reasoning, "completed"))
		}
	}
	if rs.Item != "" {
		s.open = "message"
		s.output = append(s.output, messageItem(rs.Item, "", "in_progress", nil))
		s.text.WriteString(text)
	}
	s.itemsID = len(s.output)
}

// resumedReasoning moves the reasoning of a resumed Responses stream onto its final
// assistant message: the gateway sends it as a reasoning item right before that
// message (past reasoning items are otherwise dropped, as templates drop them).
func resumedReasoning(chat map[string]any, input json.RawMessage) {
	var items []item
	msgs, _ := chat["messages"].([]runnerapi.Message)
	n := len(msgs)
	if json.Unmarshal(input, &items) != nil || len(items) < 2 || n == 0 || msgs[n-1].Role != "assistant" {
		return
	}
	rs := items[len(items)-2]
	if rs.Type != "reasoning" || items[len(items)-1].Role != "assistant" {
		return
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(rs.Content, &parts)
	var sb strings.Builder
	for _, p := range parts {
		if p.Type == "reasoning_text" {
			sb.WriteString(p.Text)
		}
	}
	msgs[n-1].ReasoningContent = sb.String()
}

// openReasoning: the final assistant message of a translated chat request has
// reasoning and no text yet, so a resumed stream's open block is its thinking block.
func openReasoning(chat map[string]any) bool {
	msgs, _ := chat["messages"].([]runnerapi.Message)
	n := len(msgs)
	return n > 0 && msgs[n-1].Role == "assistant" && msgs[n-1].ReasoningContent != "" && msgs[n-1].Content == ""
}

// keepOpenMessage keeps the final assistant message of a resumed Messages stream
// that has nothing yet (the stream broke before its first text), which the
// translation drops as an empty turn: it is the message the runner continues, a new
// turn after any assistant message before it (the client's own start of the answer,
// which stays a closed turn as the first replica rendered it).
func keepOpenMessage(chat map[string]any, in []AnthropicMessage) {
	n := len(in)
	if n == 0 || in[n-1].Role != "assistant" {
		return
	}
	bs, e := blocks(in[n-1].Content, "")
	if e != nil {
		return
	}
	for _, b := range bs {
		if b.Type != "text" || b.Text != "" {
			return // the message has something: the translation kept it
		}
	}
	msgs, _ := chat["messages"].([]runnerapi.Message)
	chat["messages"] = append(msgs, runnerapi.Message{Role: "assistant"})
}

// resume makes a go on with the Messages stream rs: started, and its block open when
// the client has its start: the thinking block while the answer continued has no
// text yet (thinking), else the text block.
func (a *anthropicStream) resume(rs runnerapi.ResumeStream, thinking bool) {
	a.started, a.index = true, rs.Index
	if rs.Open {
		a.open = "text"
		if thinking {
			a.open = "thinking"
		}
	}
}

// counted is a sink that passes the runner's token counts on
// (runnerapi.HeaderTokenCounts): each count line goes before the next event it sends.
type counted interface {
	count(line string)
}

func (s *responseState) count(line string) {
	if s.sse != nil {
		s.sse.comment = line
	}
}

func (a *anthropicStream) count(line string) { a.sse.comment = line }

// isCount: line is a count line of the runner's.
func isCount(line string) bool { return strings.HasPrefix(line, runnerapi.TokenCountComment+" ") }

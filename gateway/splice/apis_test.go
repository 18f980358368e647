package splice

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// readSpliced reads a Responses or Messages stream through a splice reader: what the
// client gets, and the break it ended with (nil for a whole stream).
func readSpliced(t *testing.T, st *Stream, stream string) (string, *Break) {
	t.Helper()
	r := NewReader(io.NopCloser(strings.NewReader(stream)), st, false)
	var out bytes.Buffer
	buf := make([]byte, 64)
	for {
		n, err := r.Read(buf)
		out.Write(buf[:n])
		if err == io.EOF {
			return out.String(), nil
		}
		if brk, ok := errors.AsType[*Break](err); ok {
			return out.String(), brk
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func event(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }

// TestSpliceResponses: a Responses stream's response, message item, next sequence
// number and text are read for its continuation; the replica's error event and the
// response.failed after it are held back from the client (and take no sequence
// number of the client's), and so are the logprobs its deltas carried; a function call
// or reasoning after the message makes it not continuable.
func TestSpliceResponses(t *testing.T) {
	head := event("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","created_at":7}}`) +
		event("response.output_item.added", `{"type":"response.output_item.added","sequence_number":1,"item":{"id":"msg_1","type":"message"}}`) +
		"data: ignored\n\n" +
		event("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_1","delta":"Hel"}`) +
		": tokens 0 2\n" +
		event("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_1","delta":"lo",`+
			`"logprobs":[{"token":"lo","logprob":-1,"bytes":[108,111],"top_logprobs":[]}]}`)
	failure := event("error", `{"code":"engine_stopped","message":"gone","param":null,"sequence_number":4,"type":"error"}`) +
		event("response.failed", `{"type":"response.failed","sequence_number":5,"response":{"id":"resp_1"}}`)
	st := &Stream{api: Responses}
	out, brk := readSpliced(t, st, head+failure)
	if brk == nil || brk.cause != "error_event" || string(st.held) != failure {
		t.Fatalf("break %v, held %q: want the error event and response.failed held", brk, st.held)
	}
	if strings.Contains(out, "error") || strings.Contains(out, ": tokens") {
		t.Errorf("the client got %q", out)
	}
	if st.text.String() != "Hello" || st.tokens.total() != 2 || len(st.logprobs) != 1 ||
		string(st.logprobs[0]) != `{"token":"lo","logprob":-1,"bytes":[108,111],"top_logprobs":[]}` {
		t.Errorf("text %q, count %d, logprobs %s", st.text.String(), st.tokens.total(), st.logprobs)
	}
	if got, want := st.ResumeHeader(), `{"id":"resp_1","created_at":7,"seq":4,"item":"msg_1"}`; got != want {
		t.Errorf("resume %s, want %s", got, want)
	}
	if ok, why := (&Continuation{st: st, shape: streamShape{n: 1}, max: 1, brk: brk, deadline: time.Now().Add(time.Second)}).Decide(time.Now()); !ok {
		t.Errorf("not continued: %s", why)
	}
	for _, item := range []string{"function_call", "reasoning"} {
		st := &Stream{api: Responses}
		readSpliced(t, st, head+event("response.output_item.added",
			`{"type":"response.output_item.added","sequence_number":4,"item":{"id":"x","type":"`+item+`"}}`))
		if !st.toolCalls && !st.strayItem {
			t.Errorf("a %s item after the message: continuable", item)
		}
	}
}

// TestSpliceResponsesReasoning: a Responses stream's reasoning item is read for its
// continuation: a break inside it goes on in it (open), one after it and before the
// message goes on after it, one in the message after it goes on in the message at
// output index 1; each sends the reasoning back.
func TestSpliceResponsesReasoning(t *testing.T) {
	start := event("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","created_at":7}}`) +
		event("response.output_item.added", `{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"rs_1","type":"reasoning"}}`) +
		event("response.reasoning_text.delta", `{"type":"response.reasoning_text.delta","sequence_number":2,"item_id":"rs_1","delta":"Let me"}`)
	closed := event("response.reasoning_text.done", `{"type":"response.reasoning_text.done","sequence_number":3,"item_id":"rs_1","text":"Let me"}`) +
		event("response.content_part.done", `{"type":"response.content_part.done","sequence_number":4,"item_id":"rs_1"}`) +
		event("response.output_item.done", `{"type":"response.output_item.done","sequence_number":5,"item":{"id":"rs_1","type":"reasoning"}}`)
	message := event("response.output_item.added", `{"type":"response.output_item.added","sequence_number":6,"item":{"id":"msg_2","type":"message"}}`) +
		event("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":7,"item_id":"msg_2","delta":"Hi"}`)
	for _, tc := range []struct {
		name, stream, resume, text string
	}{
		{"inside the reasoning", start, `{"id":"resp_1","created_at":7,"seq":3,"reasoning":"rs_1","reasoning_open":true}`, ""},
		{"after the reasoning", start + closed, `{"id":"resp_1","created_at":7,"seq":6,"reasoning":"rs_1"}`, ""},
		{"in the message after it", start + closed + message, `{"id":"resp_1","created_at":7,"seq":8,"item":"msg_2","reasoning":"rs_1"}`, "Hi"},
	} {
		st := &Stream{api: Responses}
		_, brk := readSpliced(t, st, tc.stream)
		if brk == nil || st.text.String() != tc.text || st.thoughtOf(0).String() != "Let me" {
			t.Fatalf("%s: break %v, text %q, reasoning %q", tc.name, brk, st.text.String(), st.thoughtOf(0).String())
		}
		if got := st.ResumeHeader(); got != tc.resume {
			t.Errorf("%s: resume %s, want %s", tc.name, got, tc.resume)
		}
		if ok, why := (&Continuation{st: st, shape: streamShape{n: 1}, max: 1, brk: brk, deadline: time.Now().Add(time.Second)}).Decide(time.Now()); !ok {
			t.Errorf("%s: not continued: %s", tc.name, why)
		}
	}
}

// TestSpliceMessages: a Messages stream's text block and text are read; an api_error
// event is held as the replica's failure, an invalid_request_error ends the stream as
// it came.
func TestSpliceMessages(t *testing.T) {
	head := event("message_start", `{"type":"message_start","message":{"id":"msg_1"}}`) +
		event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) +
		event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`)
	failure := event("error", `{"error":{"message":"gone","type":"api_error"},"type":"error"}`)
	st := &Stream{api: Messages}
	out, brk := readSpliced(t, st, head+failure)
	if brk == nil || string(st.held) != failure || strings.Contains(out, "api_error") || st.text.String() != "Hi" {
		t.Fatalf("break %v, held %q, client %q, text %q", brk, st.held, out, st.text.String())
	}
	if got, want := st.ResumeHeader(), `{"open":true}`; got != want {
		t.Errorf("resume %s, want %s", got, want)
	}
	request := event("error", `{"error":{"message":"no","type":"invalid_request_error"},"type":"error"}`)
	st = &Stream{api: Messages}
	if out, brk := readSpliced(t, st, head+request); brk != nil || !strings.HasSuffix(out, request) {
		t.Errorf("the request's error: break %v, client %q", brk, out)
	}
}

// TestSpliceMessagesThinking: a Messages stream's thinking block is read as the
// answer's reasoning: a break inside it continues it in that block, one after it
// opens the next block, and one in the text after it continues the text block, each
// with the thinking sent back as the assistant's thinking block.
func TestSpliceMessagesThinking(t *testing.T) {
	start := event("message_start", `{"type":"message_start","message":{"id":"msg_1"}}`) +
		event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`) +
		event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}`)
	stop := event("content_block_stop", `{"type":"content_block_stop","index":0}`)
	text := event("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`) +
		event("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}`)
	failure := event("error", `{"error":{"message":"gone","type":"api_error"},"type":"error"}`)
	for _, tc := range []struct {
		name, stream, resume, text string
	}{
		{"inside the thinking", start, `{"open":true}`, ""},
		{"after the thinking", start + stop, `{"index":1}`, ""},
		{"in the text after it", start + stop + text, `{"index":1,"open":true}`, "Hi"},
	} {
		st := &Stream{api: Messages}
		_, brk := readSpliced(t, st, tc.stream+failure)
		if brk == nil || st.text.String() != tc.text || st.thoughtOf(0).String() != "Let me" {
			t.Fatalf("%s: break %v, text %q, thinking %q", tc.name, brk, st.text.String(), st.thoughtOf(0).String())
		}
		if got := st.ResumeHeader(); got != tc.resume {
			t.Errorf("%s: resume %s, want %s", tc.name, got, tc.resume)
		}
		if ok, why := (&Continuation{st: st, shape: streamShape{n: 1}, max: 1, brk: brk, deadline: time.Now().Add(time.Second)}).Decide(time.Now()); !ok {
			t.Errorf("%s: not continued: %s", tc.name, why)
		}
	}
}

func TestContinuationBody(t *testing.T) {
	for _, tc := range []struct {
		api        API
		body, want string
	}{
		{Chat, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel\"lo"}],"model":"m","stream":true}`},
		{Messages, `{"model":"m","max_tokens":9,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
			`{"max_tokens":9,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":"Hel\"lo"}],"model":"m"}`},
		{Chat, `{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure:"}]}`,
			`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure:"},{"role":"assistant","content":"Hel\"lo"}]}`},
		{Responses, `{"model":"m","input":"hi"}`,
			`{"input":[{"content":"hi","role":"user"},{"role":"assistant","content":"Hel\"lo"}],"model":"m"}`},
		{Responses, `{"model":"m","input":[{"role":"user","content":"hi"}]}`,
			`{"input":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel\"lo"}],"model":"m"}`},
	} {
		got, err := continuationBody(tc.api, []byte(tc.body), openAnswer{text: "Hel\"lo"}, false)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: %s (%v), want %s", tc.body, got, err, tc.want)
		}
	}
	got, err := continuationBody(Chat, []byte(`{"n":2,"messages":[]}`), openAnswer{text: "One", reasoning: "Hm"}, true)
	if want := `{"messages":[{"role":"assistant","content":"One","reasoning_content":"Hm"}]}`; err != nil || string(got) != want {
		t.Errorf("one choice with reasoning: %s (%v), want %s", got, err, want)
	}
	got, err = continuationBody(Messages, []byte(`{"messages":[]}`), openAnswer{reasoning: "Hm"}, false)
	if want := `{"messages":[{"content":[{"signature":"","thinking":"Hm","type":"thinking"}],"role":"assistant"}]}`; err != nil || string(got) != want {
		t.Errorf("a Messages answer inside its thinking: %s (%v), want %s", got, err, want)
	}
	got, err = continuationBody(Responses, []byte(`{"input":"hi"}`), openAnswer{text: "One", reasoning: "Hm"}, false)
	if want := `{"input":[{"content":"hi","role":"user"},{"content":[{"text":"Hm","type":"reasoning_text"}],"summary":[],"type":"reasoning"},` +
		`{"role":"assistant","content":"One"}]}`; err != nil || string(got) != want {
		t.Errorf("a Responses answer after its reasoning: %s (%v), want %s", got, err, want)
	}
	got, err = continuationBody(Responses, []byte(`{"input":"hi"}`), openAnswer{text: "One", logprobs: []json.RawMessage{[]byte(`{"token":"One"}`)}}, false)
	if want := `{"input":[{"content":"hi","role":"user"},{"content":[{"annotations":[],"logprobs":[{"token":"One"}],"text":"One","type":"output_text"}],` +
		`"role":"assistant"}]}`; err != nil || string(got) != want {
		t.Errorf("a Responses answer with logprobs: %s (%v), want %s", got, err, want)
	}
	if _, err := continuationBody(Chat, []byte(`{"messages":"x"}`), openAnswer{text: "a"}, false); err == nil {
		t.Error("messages that are not a list: no error")
	}
}

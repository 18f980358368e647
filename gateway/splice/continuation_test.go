package splice

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

func TestDecideContinuation(t *testing.T) {
	now := time.Unix(1000, 0)
	base := func() Continuation {
		return Continuation{brk: &Break{cause: "eof"}, st: &Stream{}, shape: streamShape{n: 1}, max: 1, deadline: now.Add(time.Second)}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Continuation)
		want   string
	}{
		{"a cut connection", func(*Continuation) {}, Continued},
		{"a replica's error event", func(c *Continuation) { c.brk.cause, c.st.held = "error_event", []byte("data: {}\n\n") }, Continued},
		{"disabled", func(c *Continuation) { c.max = -1 }, Disabled},
		{"continued as often as allowed", func(c *Continuation) { c.st.continued = 1 }, Limit},
		{"a higher limit", func(c *Continuation) { c.st.continued, c.max = 1, 2 }, Continued},
		{"the deadline passed", func(c *Continuation) { c.deadline = now }, Deadline},
		{"it had finished", func(c *Continuation) { c.st.finished = true }, Finished},
		{"a tool call", func(c *Continuation) { c.st.toolCalls = true }, ToolCall},
		{"reasoning on Responses", func(c *Continuation) { c.st.rsItem, c.st.api = "rs_1", Responses }, Continued},
		{"a second reasoning item on Responses", func(c *Continuation) { c.st.strayItem, c.st.api = true, Responses }, Reasoning},
		{"n > 1 without the runner's count", func(c *Continuation) { c.shape.n = 2 }, Unsupported},
		{"n > 1", func(c *Continuation) { c.shape.n, c.st.n = 2, 2; c.st.tokens.read([]byte("1 3"), 0) }, Continued},
		{"n > 1, every choice finished", func(c *Continuation) {
			c.shape.n, c.st.n = 2, 2
			c.st.tokens.read([]byte("1 3"), 0)
			c.st.end(0)
			c.st.end(1)
		}, Finished},
		{"n > 1, one choice's continuation retried", func(c *Continuation) {
			c.shape.n, c.st.n, c.st.continued, c.taken = 2, 2, 1, true
			c.st.tokens.read([]byte("1 3"), 0)
		}, Continued},
		{"a replica refused it", func(c *Continuation) { c.refusal = "no" }, Refused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mutate(&c)
			ok, why := c.Decide(now)
			if why != tc.want || ok != (tc.want == Continued) {
				t.Errorf("decision %v %q, want %q", ok, why, tc.want)
			}
		})
	}
}

func TestShapeOf(t *testing.T) {
	for _, tc := range []struct {
		api  API
		body string
		want streamShape
	}{
		{Chat, `{"messages":[]}`, streamShape{n: 1}},
		{Chat, `{"n":3}`, streamShape{n: 3}},
		{Chat, `{"stream_options":{"include_usage":true}}`, streamShape{n: 1, usage: true}},
		{Chat, `{"stream_options":{"include_usage":false}}`, streamShape{n: 1}},
		{Responses, `{"stream_options":{"include_usage":true}}`, streamShape{n: 1}},
		{Chat, `{"response_format":{"type":"json_object"},"tool_choice":"required"}`, streamShape{n: 1}},
		{Chat, `{"messages":[{"role":"assistant"}]}`, streamShape{n: 1}},
		{Responses, `{"input":"hi","n":3}`, streamShape{n: 1}},
		{Messages, `{"messages":[{"role":"user"},{"role":"assistant"}]}`, streamShape{n: 1}},
	} {
		if got := shapeOf(tc.api, []byte(tc.body)); got != tc.want {
			t.Errorf("%d %s: %+v, want %+v", tc.api, tc.body, got, tc.want)
		}
	}
}

// promptLine is the prompt's usage a streamingAgent reports before its role chunk: 5
// tokens, 2 of them cached (its usage chunk's prompt_tokens).
var promptLine = runnerapi.PromptCountComment + " 5 2\n"

// chunkEvent is a Chat Completions chunk event of stream id.
func chunkEvent(id, delta string, finish string) string {
	f := "null"
	if finish != "" {
		f = fmt.Sprintf("%q", finish)
	}
	return fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":%d,"model":"m","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n",
		id, len(id), delta, f)
}

func content(s string) string { return fmt.Sprintf(`{"content":%q}`, s) }

const roleDelta = `{"role":"assistant","content":""}`

// TestTokenCountRead: count lines are read as the runner writes them; one that is not
// a count, or goes down, makes the count unknown.
func TestTokenCountRead(t *testing.T) {
	for _, tc := range []struct {
		lines []string
		total int64
		known bool
	}{
		{nil, 0, false},
		{[]string{"0 1", "0 2", "0 3"}, 3, true},
		{[]string{"0 1", "1 4", "0 2\r"}, 6, true},
		{[]string{"0 2", "0 1"}, 0, false},
		{[]string{"0 x"}, 0, false},
		{[]string{"-1 2"}, 0, false},
		{[]string{"128 2"}, 0, false},
		{[]string{"0 -2"}, 0, false},
		{[]string{"0"}, 0, false},
	} {
		var c tokenCount
		for _, l := range tc.lines {
			c.read([]byte(l), 0)
		}
		if c.known() != tc.known || (tc.known && c.total() != tc.total) {
			t.Errorf("%q: known %v total %d, want %v %d", tc.lines, c.known(), c.total(), tc.known, tc.total)
		}
	}
	c := tokenCount{}
	c.read([]byte("0 5"), 0)
	c.broke()
	c.read([]byte("0 2"), 0)
	if c.total() != 7 {
		t.Errorf("a continued count %d, want 5 + 2", c.total())
	}
}

// TestContentOnly: the usual content chunk is read without decoding it whole, to the
// same text; every other chunk is left to the whole decoding.
func TestContentOnly(t *testing.T) {
	lp := `,"logprobs":{"content":[{"token":"\"content\":\"x","logprob":-1,"bytes":[1],"top_logprobs":[]}],"refusal":[]}`
	for _, tc := range []struct {
		data string
		want string
		ok   bool
	}{
		{data: chunkData(content("plain text")), want: "plain text", ok: true},
		{data: chunkData(content("a \"quote\"\nand a line ✓")), want: "a \"quote\"\nand a line ✓", ok: true},
		{data: chunkData(content("with logprobs") + lp), want: "with logprobs", ok: true},
		{data: chunkData(content(`\`)), want: `\`, ok: true},
		{data: strings.Replace(chunkData(content("choice 1")), `"index":0`, `"index":1`, 1)},
		{data: chunkData(roleDelta)},
		{data: chunkData(`{"reasoning_content":"hm"}`)},
		{data: chunkData(`{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}`)},
		{data: strings.Replace(chunkData(content("done")), `"finish_reason":null`, `"finish_reason":"stop"`, 1)},
	} {
		got, ok := contentOnly([]byte(tc.data))
		if ok != tc.ok || string(got) != tc.want {
			t.Errorf("%s: %q %v, want %q %v", tc.data, got, ok, tc.want, tc.ok)
		}
	}
}

// chunkData is the data of a chunk event with delta (and its logprobs appended to the
// delta's object when the caller adds them after it).
func chunkData(delta string) string {
	ev := chunkEvent("chatcmpl-x", delta, "")
	return strings.TrimSuffix(strings.TrimPrefix(ev, "data: "), "\n\n")
}

package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/splice"
	"github.com/macfleet/macfleet/test/support/testenv"
)

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

// streamingAgent answers a first request with a stream of words that ends as first
// says (cut: the connection closes; engine_stopped: the agent's error event; done),
// and a continuation (runnerapi.HeaderContinue) with rest, ending as cont says.
type streamingAgent struct {
	first, rest []string
	// think and contThink are reasoning the first stream and a continuation send
	// before their words.
	think, contThink []string
	firstEnd         string
	contEnd          string // done, cut, status_503
	tool             string // the first stream sends a tool call with these arguments before its end
	// reported is the output a stream that ends reports in its usage trailer (none
	// when 0); counts are the token counts asked for (runnerapi.HeaderTokenCounts)
	// put before each content and tool call chunk, a word a token, and the prompt's
	// (promptLine, or prompt's value) before the role chunk, unless noPrompt (an
	// older runner).
	reported int
	noPrompt bool
	prompt   string

	mu        sync.Mutex
	conts     []string // the continuations' last messages' content
	contCount []string // their runnerapi.HeaderContinuedTokens
}

func (a *streamingAgent) serve(_ int, w http.ResponseWriter, r *http.Request) {
	cont := r.Header.Get(runnerapi.HeaderContinue) == runnerapi.ContinueFinalMessage
	id, words, end := "chatcmpl-first", a.first, a.firstEnd
	if cont {
		var req struct{ Messages []runnerapi.Message }
		_ = json.NewDecoder(r.Body).Decode(&req)
		last := req.Messages[len(req.Messages)-1]
		a.mu.Lock()
		if last.ReasoningContent != "" {
			last.Role += "(thought " + last.ReasoningContent + ")"
		}
		a.conts = append(a.conts, last.Role+":"+string(last.Content))
		a.contCount = append(a.contCount, r.Header.Get(runnerapi.HeaderContinuedTokens))
		a.mu.Unlock()
		id, words, end = "chatcmpl-cont", a.rest, a.contEnd
		if end == "status_503" {
			status(http.StatusServiceUnavailable, "")(0, w, r)
			return
		}
		if end == "status_400" {
			status(http.StatusBadRequest, "")(0, w, r)
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	if end == "cut_at_once" { // the status only
		_ = rc.Flush()
		conn, _, _ := rc.Hijack()
		conn.Close()
		return
	}
	if a.reported > 0 {
		w.Header().Set("Trailer", metering.Header)
	}
	if end == "stopped_at_once" { // the agent's error event before any chunk
		fmt.Fprint(w, engineStoppedEvent)
		return
	}
	counts := r.Header.Get(runnerapi.HeaderTokenCounts) == runnerapi.TokenCountComments
	switch {
	case counts && a.prompt != "":
		fmt.Fprintf(w, "%s %s\n", runnerapi.PromptCountComment, a.prompt)
	case counts && !a.noPrompt:
		fmt.Fprint(w, promptLine)
	}
	fmt.Fprint(w, chunkEvent(id, roleDelta, ""))
	think := a.think
	if cont {
		think = a.contThink
	}
	for i, word := range think {
		if counts {
			fmt.Fprintf(w, "%s 0 %d\n", runnerapi.TokenCountComment, i+1)
		}
		fmt.Fprint(w, chunkEvent(id, fmt.Sprintf(`{"reasoning_content":%q}`, word), ""))
		_ = rc.Flush()
	}
	for i, word := range words {
		if counts {
			fmt.Fprintf(w, "%s 0 %d\n", runnerapi.TokenCountComment, len(think)+i+1)
		}
		fmt.Fprint(w, chunkEvent(id, content(word), ""))
		_ = rc.Flush()
	}
	if a.tool != "" && !cont {
		args, _ := json.Marshal(a.tool)
		for i, delta := range []string{`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}`,
			fmt.Sprintf(`{"tool_calls":[{"index":0,"function":{"arguments":%s}}]}`, args)} {
			if counts {
				fmt.Fprintf(w, "%s 0 %d\n", runnerapi.TokenCountComment, len(think)+len(words)+i+1)
			}
			fmt.Fprint(w, chunkEvent(id, delta, ""))
		}
	}
	switch end {
	case "finish_cut":
		fmt.Fprint(w, chunkEvent(id, `{}`, "stop"))
		_ = rc.Flush()
		conn, _, _ := rc.Hijack()
		conn.Close()
	case "cut":
		_ = rc.Flush()
		conn, _, _ := rc.Hijack()
		conn.Close()
	case "bad_request":
		fmt.Fprint(w, `data: {"error":{"message":"no","type":"invalid_request_error","code":"invalid_value"}}`+"\n\n")
	case "engine_stopped":
		fmt.Fprint(w, engineStoppedEvent)
	case "done_cut": // the whole answer, then the connection cut before the trailer
		fmt.Fprint(w, chunkEvent(id, `{}`, "stop"))
		fmt.Fprint(w, "data: [DONE]\n\n")
		_ = rc.Flush()
		conn, _, _ := rc.Hijack()
		conn.Close()
	case "done":
		fmt.Fprint(w, chunkEvent(id, `{}`, "stop"))
		fmt.Fprintf(w, `data: {"id":%q,"object":"chat.completion.chunk","created":%d,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}`+"\n\n", id, len(id))
		fmt.Fprint(w, "data: [DONE]\n\n")
		if a.reported > 0 {
			w.Header().Set(metering.Header, metering.Usage{Input: 5, Output: int64(a.reported)}.String())
		}
	}
}

// engineStoppedEvent is the agent's error event of a runner that died.
const engineStoppedEvent = `data: {"error":{"message":"the engine of model \"m\" stopped","type":"service_unavailable","code":"engine_stopped"}}` + "\n\n"

// clientStream is what a client read of a stream.
type clientStream struct {
	ids       map[string]bool
	created   map[string]bool
	text      string
	reasoning string
	roles     int
	usages    int
	dones     int
	errCode   string
	errMsg    string
	trailer   string
	finish    string
}

func readClientStream(t *testing.T, resp *http.Response) clientStream {
	t.Helper()
	cs := clientStream{ids: map[string]bool{}, created: map[string]bool{}}
	br := bufio.NewReader(resp.Body)
	var text, reasoning strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "data: ")
		if !ok {
			if line != "\n" {
				t.Fatalf("not SSE: %q", line)
			}
			continue
		}
		if data == "[DONE]" {
			cs.dones++
			continue
		}
		var c struct {
			ID      string          `json:"id"`
			Created json.RawMessage `json:"created"`
			Choices []struct {
				Delta struct {
					Role, Content string
					Reasoning     string `json:"reasoning_content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *runnerapi.Usage                `json:"usage"`
			Error *struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if c.Error != nil {
			cs.errCode, cs.errMsg = c.Error.Code, c.Error.Message
			continue
		}
		cs.ids[c.ID], cs.created[string(c.Created)] = true, true
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
			reasoning.WriteString(ch.Delta.Reasoning)
			if ch.Delta.Role != "" {
				cs.roles++
			}
			if ch.FinishReason != nil {
				cs.finish = *ch.FinishReason
			}
		}
		if c.Usage != nil {
			cs.usages++
		}
	}
	cs.text, cs.reasoning, cs.trailer = text.String(), reasoning.String(), resp.Trailer.Get(HeaderContinued)
	return cs
}

// streamThrough streams a chat through the gateway's path and reads it as a client.
func streamThrough(t *testing.T, g *testGateway, path string) clientStream {
	t.Helper()
	return streamBodyThrough(t, g, path, "")
}

// streamBodyThrough streams body (a plain chat when "") through the gateway's path.
func streamBodyThrough(t *testing.T, g *testGateway, path, body string) clientStream {
	t.Helper()
	if body == "" {
		body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"count"}]}`
	}
	resp, err := http.Post(g.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return readClientStream(t, resp)
}

// TestStreamContinuation: a Chat Completions stream whose replica fails after its
// first byte is continued on the other replica in the same stream, or ends with the
// error as before when it cannot be.
func TestStreamContinuation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		agent    *streamingAgent
		replicas int
		opts     Options
		outcome  string
		// want is what the client reads; conts the continuations' final messages;
		// outcome "": not a break.
		want  clientStream
		conts []string
		// errSays is in the error's message; wantID the stream's id (chatcmpl-first
		// when empty); body the request's (a plain chat when empty).
		errSays, wantID, body string
	}{
		{name: "cut connection", agent: &streamingAgent{first: []string{"One", ", two"}, firstEnd: "cut", rest: []string{", three"}, contEnd: "done"},
			outcome: splice.Continued, conts: []string{"assistant:One, two"},
			want: clientStream{text: "One, two, three", roles: 1, usages: 1, dones: 1, trailer: "1", finish: "stop"}},
		{name: "engine stopped", agent: &streamingAgent{first: []string{"One"}, firstEnd: "engine_stopped", rest: []string{", two"}, contEnd: "done"},
			outcome: splice.Continued, conts: []string{"assistant:One"},
			want: clientStream{text: "One, two", roles: 1, usages: 1, dones: 1, trailer: "1", finish: "stop"}},
		{name: "the continuation breaks too", agent: &streamingAgent{first: []string{"One"}, firstEnd: "engine_stopped", rest: []string{", two"}, contEnd: "cut"},
			outcome: splice.Limit, conts: []string{"assistant:One"},
			want: clientStream{text: "One, two", roles: 1, errCode: "upstream_error"}},
		{name: "a higher limit", opts: Options{StreamContinuations: 2},
			agent:   &streamingAgent{first: []string{"One"}, firstEnd: "engine_stopped", rest: []string{", two"}, contEnd: "cut"},
			outcome: splice.Limit, conts: []string{"assistant:One", "assistant:One, two"},
			want: clientStream{text: "One, two, two", roles: 1, errCode: "upstream_error"}},
		// A break in or after a tool call ends the stream cleanly: tool_calls when the
		// call's arguments are whole, length when they were cut.
		{name: "inside a tool call", agent: &streamingAgent{first: []string{"One"}, firstEnd: "engine_stopped", tool: `{"a`},
			outcome: splice.ToolCall, want: clientStream{text: "One", roles: 1, dones: 1, finish: "length"}},
		{name: "after a tool call", agent: &streamingAgent{first: []string{"One"}, firstEnd: "cut", tool: `{"a":1}`},
			outcome: splice.ToolCall, want: clientStream{text: "One", roles: 1, dones: 1, finish: "tool_calls"}},
		{name: "after its finish", agent: &streamingAgent{first: []string{"One"}, firstEnd: "finish_cut"},
			outcome: splice.Finished, want: clientStream{text: "One", roles: 1, dones: 1, finish: "stop"}},
		// Reasoning is sent back as the message's reasoning_content: the runner
		// continues inside it while there is no content (test/runner's
		// TestContinueInReasoning), after it once there is.
		{name: "inside the reasoning", agent: &streamingAgent{think: []string{"Let", " me"}, firstEnd: "engine_stopped",
			contThink: []string{" see"}, rest: []string{"One"}, contEnd: "done"},
			outcome: splice.Continued, conts: []string{"assistant(thought Let me):"},
			want: clientStream{reasoning: "Let me see", text: "One", roles: 1, usages: 1, dones: 1, trailer: "1", finish: "stop"}},
		{name: "after the reasoning", agent: &streamingAgent{think: []string{"Hm."}, first: []string{"One"}, firstEnd: "cut",
			rest: []string{", two"}, contEnd: "done"},
			outcome: splice.Continued, conts: []string{"assistant(thought Hm.):One"},
			want: clientStream{reasoning: "Hm.", text: "One, two", roles: 1, usages: 1, dones: 1, trailer: "1", finish: "stop"}},
		// Cut before any chunk: the continuation's chunks are the stream's.
		{name: "cut before any chunk", agent: &streamingAgent{firstEnd: "cut_at_once", rest: []string{"One"}, contEnd: "done"},
			outcome: splice.Continued, conts: []string{"assistant:"}, wantID: "chatcmpl-cont",
			want: clientStream{text: "One", roles: 1, usages: 1, dones: 1, trailer: "1", finish: "stop"}},
		// A cut after [DONE] (the Mac lost before the usage trailer) is no break: the
		// client has the whole answer, and nothing follows its [DONE].
		{name: "cut after done", agent: &streamingAgent{first: []string{"One"}, firstEnd: "done_cut", rest: []string{", two"}, contEnd: "done"},
			want: clientStream{text: "One", roles: 1, dones: 1, finish: "stop"}},
		// An error that is the request's, not the replica's, ends the stream as it did.
		{name: "the request's error", agent: &streamingAgent{first: []string{"One"}, firstEnd: "bad_request"},
			want: clientStream{text: "One", roles: 1, errCode: "invalid_value"}},
		// Output under a grammar is continued (the runner advances the grammar past
		// the text sent: test/runner's TestContinueUnderGrammar).
		{name: "under a grammar", body: `{"model":"m","stream":true,"response_format":{"type":"json_object"},` +
			`"messages":[{"role":"user","content":"count"}]}`,
			agent:   &streamingAgent{first: []string{`{"a"`}, firstEnd: "cut", rest: []string{`:1}`}, contEnd: "done"},
			outcome: splice.Continued, conts: []string{`assistant:{"a"`},
			want: clientStream{text: `{"a":1}`, roles: 1, usages: 1, dones: 1, trailer: "1", finish: "stop"}},
		// A continuation the replica refuses (a 400: the text does not follow the
		// grammar) ends the stream at once, not after trying every replica until the
		// deadline.
		{name: "refused", opts: Options{ContinueTimeout: time.Minute},
			agent:   &streamingAgent{first: []string{"One"}, firstEnd: "cut", contEnd: "status_400"},
			outcome: splice.Refused, conts: []string{"assistant:One"}, want: clientStream{text: "One", roles: 1, errCode: "upstream_error"},
			errSays: "not continued on another replica: a replica refused to continue it: upstream says 400"},
		{name: "no replica in time", replicas: 1, opts: Options{ContinueTimeout: 300 * time.Millisecond},
			agent:   &streamingAgent{first: []string{"One"}, firstEnd: "cut", contEnd: "status_503"},
			outcome: splice.Deadline, want: clientStream{text: "One", roles: 1, errCode: "upstream_error"},
			errSays: "not continued on another replica: no other replica took it within --stream-continue-timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, tc.agent.serve)
			g := newTestGateway(t, tc.opts)
			hosts := []string{up.host(), up.host()}
			if tc.replicas == 1 {
				hosts = hosts[:1]
			}
			g.serveReplicas(hosts...)
			got := streamBodyThrough(t, g, "/v1/chat/completions", tc.body)
			if tc.wantID == "" {
				tc.wantID = "chatcmpl-first"
			}
			if len(got.ids) != 1 || !got.ids[tc.wantID] || len(got.created) != 1 {
				t.Errorf("chunk ids %v, created %v: want the first stream's alone", got.ids, got.created)
			}
			if !strings.Contains(got.errMsg, tc.errSays) {
				t.Errorf("error message %q, want %q in it", got.errMsg, tc.errSays)
			}
			got.ids, got.created, got.errMsg = nil, nil, ""
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(clientStream{})); d != "" {
				t.Errorf("client read (-want +got):\n%s", d)
			}
			tc.agent.mu.Lock()
			conts := tc.agent.conts
			tc.agent.mu.Unlock()
			if tc.outcome != splice.Deadline && !cmp.Equal(tc.conts, conts) {
				t.Errorf("continuations sent %q, want %q", conts, tc.conts)
			}
			if tc.outcome == "" {
				if n := testutil.CollectAndCount(g.metrics.continuations); n != 0 || up.calls.Load() != 1 {
					t.Errorf("%d continuation outcomes, %d calls; want none, 1", n, up.calls.Load())
				}
				return
			}
			testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
				n := testutil.ToFloat64(g.metrics.continuations.WithLabelValues("a/m", tc.outcome))
				return n == 1, fmt.Sprintf("stream_continuations_total{outcome=%q} = %v", tc.outcome, n)
			})
		})
	}
}

// TestStreamTokenCount: the gateway counts the tokens of a Chat Completions stream it
// forwarded from the runner's count lines, which the client does not get; a
// continuation is told the count of the tokens sent, and a usage report that is not
// the count is counted in usage_count_disagreements_total.
func TestStreamTokenCount(t *testing.T) {
	for _, tc := range []struct {
		name     string
		agent    *streamingAgent
		opts     Options
		contSent []string
		disagree float64
		// path: the request's (Chat Completions when ""); broken: the stream ends
		// with the gateway's error.
		path   string
		broken bool
	}{
		{name: "continued, the report the count", agent: &streamingAgent{first: []string{"One", ", two"}, firstEnd: "cut",
			rest: []string{", three"}, contEnd: "done", reported: 3}, contSent: []string{"2"}},
		{name: "continued, the report not the count", agent: &streamingAgent{first: []string{"One", ", two"}, firstEnd: "engine_stopped",
			rest: []string{", three"}, contEnd: "done", reported: 5}, contSent: []string{"2"}, disagree: 1},
		{name: "not continued, the report the count", agent: &streamingAgent{first: []string{"One", ", two"}, firstEnd: "done", reported: 2}},
		{name: "not continued, the report not the count", agent: &streamingAgent{first: []string{"One"}, firstEnd: "done", reported: 4},
			disagree: 1},
		{name: "continuations off, counted", opts: Options{StreamContinuations: -1},
			agent: &streamingAgent{first: []string{"One"}, firstEnd: "done", reported: 2}, disagree: 1},
		{name: "a text completion, counted", path: "/v1/completions",
			agent: &streamingAgent{first: []string{"One"}, firstEnd: "done", reported: 2}, disagree: 1},
		{name: "continued, the first replica stopped before any chunk", agent: &streamingAgent{firstEnd: "stopped_at_once",
			rest: []string{"One", ", two"}, contEnd: "done", reported: 2}, contSent: []string{""}},
		{name: "a text completion, not continued", path: "/v1/completions",
			agent: &streamingAgent{first: []string{"One"}, firstEnd: "cut", rest: []string{", two"}, contEnd: "done"}, broken: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, tc.agent.serve)
			g := newTestGateway(t, tc.opts)
			g.serveReplicas(up.host(), up.host())
			if tc.path == "" {
				tc.path = "/v1/chat/completions"
			}
			got := streamThrough(t, g, tc.path) // fails on a line that is not data
			if whole := got.dones == 1 && got.errCode == ""; whole == tc.broken {
				t.Fatalf("client read %+v, want a whole stream: %v", got, !tc.broken)
			}
			tc.agent.mu.Lock()
			sent := tc.agent.contCount
			tc.agent.mu.Unlock()
			if !cmp.Equal(sent, tc.contSent) {
				t.Errorf("continuations told %q tokens were sent, want %q", sent, tc.contSent)
			}
			testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
				n := testutil.ToFloat64(g.metrics.countDisagreements.WithLabelValues("a/m"))
				return n == tc.disagree, fmt.Sprintf("usage_count_disagreements_total = %v, want %v", n, tc.disagree)
			})
			// Every answer is metered once, whatever broke on the way.
			if n := testutil.ToFloat64(g.metrics.usage.Requests); n != 1 {
				t.Errorf("%v answers metered, want 1", n)
			}
		})
	}
}

// TestContinuationBacksOff: a continuation that every replica refuses before its first
// byte is tried again less and less often (the backoff doubles across the stream's
// tries, 0.1 s to 2 s), not every 0.1 s until the deadline, and the client gets the
// error once the deadline passes.
func TestContinuationBacksOff(t *testing.T) {
	agent := &streamingAgent{first: []string{"One"}, firstEnd: "cut", contEnd: "status_503"}
	up := newUpstream(t, agent.serve)
	g := newTestGateway(t, Options{ContinueTimeout: 1500 * time.Millisecond})
	g.serveReplicas(up.host(), up.host())
	got := streamThrough(t, g, "/v1/chat/completions")
	// Tries at about 0, 0.1, 0.3, 0.7 and 1.5 s with a doubling backoff; 15 at 0.1 s.
	if tries := up.calls.Load() - 1; got.errCode != "upstream_error" || tries < 2 || tries > 7 {
		t.Errorf("%d continuation tries in 1.5 s, client read %+v: want 2 to 7 tries, then the error", tries, got)
	}
}

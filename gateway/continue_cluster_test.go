package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/macfleet/macfleet/test/support/chatstream"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// thinkingTemplate opens a <think> block in every generation prompt: a model under
// it writes its answer as reasoning.
const thinkingTemplate = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
	"{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"

// breakingProxy passes an agent's answers on, and records the requests' bodies. The
// first stream it gets once armed it stops after cutAfter events of the kind named
// (or after fewer, at the end of their run, when the runner put the answer in fewer),
// signals stalled, waits for release and then breaks its connection, as a replica
// whose runner dies mid-answer does.
type breakingProxy struct {
	agent    string
	kind     string
	cutAfter int
	armed    atomic.Bool
	passed   atomic.Int32 // events of kind passed on before the break
	stalled  chan struct{}
	release  chan struct{}

	mu     sync.Mutex
	bodies []string
}

// requests are the bodies of the requests the proxy passed on.
func (p *breakingProxy) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.bodies)
}

func (p *breakingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	p.bodies = append(p.bodies, string(body))
	p.mu.Unlock()
	resp := forwardTo(w, r, body, p.agent)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	cut := r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") && p.armed.CompareAndSwap(true, false)
	rc := http.NewResponseController(w)
	br := bufio.NewReader(resp.Body)
	seen := 0
	for {
		line, err := br.ReadString('\n')
		// An event of another kind after the first of p.kind: the run of them is over
		// before cutAfter (the runner put several tokens in one delta). The break lands
		// before it, so that every armed stream breaks inside the run.
		if cut && seen > 0 && strings.HasPrefix(line, "event: ") && line != "event: "+p.kind+"\n" {
			p.stall(seen)
		}
		_, _ = io.WriteString(w, line)
		_ = rc.Flush()
		if err != nil {
			return
		}
		if cut && line == "event: "+p.kind+"\n" {
			seen++
		}
		if cut && seen == p.cutAfter && line == "\n" {
			p.stall(seen)
		}
	}
}

// stall records that passed events of p.kind went through, signals stalled, waits
// for release and breaks the connection mid-stream.
func (p *breakingProxy) stall(passed int) {
	p.passed.Store(int32(passed))
	close(p.stalled)
	<-p.release
	panic(http.ErrAbortHandler)
}

// breakingFleet is a gateway over a deployment "tiny" of two replicas of one real
// agent serving a model synthesized from spec, each behind a breakingProxy (returned,
// unarmed): tiny-0, Ready, where streams start, and tiny-1, made Ready once tiny-0's
// proxy has stalled the stream it cuts, which it then breaks.
func breakingFleet(t *testing.T, spec ggufsynth.Spec, kind string, cutAfter int) (g runningGateway, first, second *breakingProxy) {
	t.Helper()
	runner := os.Getenv(runnerproc.RunnerEnv)
	if runner == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	e := cluster(t)
	agent := startAgentOf(t, runner, spec)
	proxy := &breakingProxy{agent: agent, kind: kind, cutAfter: cutAfter, stalled: make(chan struct{}), release: make(chan struct{})}
	second = &breakingProxy{agent: agent}
	ps, ps1 := httptest.NewServer(proxy), httptest.NewServer(second)
	t.Cleanup(ps.Close)
	t.Cleanup(ps1.Close)
	other := strings.TrimPrefix(ps1.URL, "http://")

	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	macA, macB := "mac-a-"+f.ns, "mac-b-"+f.ns
	f.node(macA, metav1.ConditionTrue)
	f.node(macB, metav1.ConditionTrue)
	f.deployment("tiny", "", 2)
	f.replica("tiny-0", "tiny", macA)
	f.replica("tiny-1", "tiny", macB)
	f.setReplica("tiny-0", metav1.ConditionTrue, strings.TrimPrefix(ps.URL, "http://"))
	f.setReplica("tiny-1", metav1.ConditionFalse, other)
	g = startGateway(t, e, gateway.Config{})
	waitModel(t, g, "tiny", f.ns, 1)
	go func() {
		select {
		case <-proxy.stalled:
		case <-t.Context().Done():
			return
		}
		f.setReplica("tiny-1", metav1.ConditionTrue, other)
		for n, _ := readyReplicas(g, "tiny", f.ns); n != 2 && t.Context().Err() == nil; n, _ = readyReplicas(g, "tiny", f.ns) {
			time.Sleep(20 * time.Millisecond) // polling the gateway's table
		}
		close(proxy.release)
	}()
	return g, proxy, second
}

// answerTokens caps the answers of these tests.
const answerTokens = 24

// streamResponses streams p to the model tiny through the gateway, greedy and capped
// at answerTokens, read by the official OpenAI client; hr is its HTTP response
// (its trailer once the stream is read). The stream ends with the test.
func streamResponses(t *testing.T, g runningGateway, p responses.ResponseNewParams, hr **http.Response) *ssestream.Stream[responses.ResponseStreamEventUnion] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	p.Model, p.MaxOutputTokens, p.Temperature = "tiny", openai.Int(answerTokens), openai.Float(0)
	c := openai.NewClient(option.WithBaseURL(g.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	stream := c.Responses.NewStreaming(ctx, p, option.WithResponseInto(hr))
	t.Cleanup(func() { _ = stream.Close() })
	return stream
}

// reasoningRead is what a client read of a Responses stream with reasoning.
type reasoningRead struct {
	kinds           []string
	deltas, doneTxt string
	ids, items      map[string]bool
	final           *responses.Response
	hr              *http.Response
}

// readReasoning streams TestResponsesReasoningContinued's request through g and reads
// it whole, checking each event's sequence number as it comes.
func readReasoning(t *testing.T, g runningGateway) reasoningRead {
	t.Helper()
	r := reasoningRead{ids: map[string]bool{}, items: map[string]bool{}}
	stream := streamResponses(t, g, responses.ResponseNewParams{
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Think about the sea.")}}, &r.hr)
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != int64(len(r.kinds)) {
			t.Errorf("event %d (%s) has sequence number %d", len(r.kinds), ev.Type, ev.SequenceNumber)
		}
		r.kinds = append(r.kinds, ev.Type)
		switch ev.Type {
		case "response.created", "response.in_progress":
			r.ids[ev.Response.ID] = true
		case "response.output_item.added", "response.output_item.done":
			r.items[ev.Item.ID+" "+ev.Item.Type] = true
			if ev.Item.Type == "reasoning" && ev.OutputIndex != 0 {
				t.Errorf("%s: reasoning at output index %d", ev.Type, ev.OutputIndex)
			}
		case "response.reasoning_text.delta":
			r.deltas += ev.Delta
		case "response.reasoning_text.done":
			r.doneTxt = ev.Text
		case "response.completed", "response.incomplete":
			resp := ev.Response
			r.final = &resp
			r.ids[resp.ID] = true
		case "error", "response.failed":
			t.Errorf("%s event: %s", ev.Type, ev.RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestResponsesReasoningContinued: a Responses stream whose replica breaks inside its
// reasoning item is continued on another replica (a real agent and runner) inside
// that item: the client, the official OpenAI client, reads one response, one
// reasoning item under one id at output index 0, sequence numbers without a gap,
// the item's done events and the final response carrying all the reasoning it read
// (before the break and after), one terminal event and the continued trailer.
func TestResponsesReasoningContinued(t *testing.T) {
	spec := ggufsynth.Tiny()
	spec.ChatTemplate = thinkingTemplate
	g, proxy, _ := breakingFleet(t, spec, "response.reasoning_text.delta", 3)
	// The break lands after the third reasoning delta, or at the end of their run
	// when the runner put the reasoning in fewer (its reader lagged).
	proxy.armed.Store(true)
	got := readReasoning(t, g)
	kinds, deltas, doneTxt, ids, items, final, hr := got.kinds, got.deltas, got.doneTxt, got.ids, got.items, got.final, got.hr
	if final == nil || kinds[0] != "response.created" || !strings.HasPrefix(kinds[len(kinds)-1], "response.") || len(ids) != 1 {
		t.Fatalf("events %v, response ids %v: want one response, created first and one terminal event last", kinds, ids)
	}
	var reasoningItems int
	for item := range items {
		if strings.HasSuffix(item, " reasoning") {
			reasoningItems++
		}
	}
	if reasoningItems != 1 || deltas == "" || doneTxt != deltas {
		t.Errorf("items %v, reasoning deltas %q, reasoning_text.done %q: want one reasoning item whose done text is its deltas", items, deltas, doneTxt)
	}
	if len(final.Output) == 0 || final.Output[0].Type != "reasoning" || len(final.Output[0].Content) != 1 || final.Output[0].Content[0].Text != deltas {
		t.Errorf("the response's output %+v, want the reasoning item first with all its reasoning %q", final.Output, deltas)
	}
	if u := final.Usage; u.OutputTokens == 0 || u.OutputTokens > answerTokens || u.InputTokens == 0 {
		t.Errorf("usage %+v, want 1 to %d output tokens and the prompt's", u, answerTokens)
	}
	if got := hr.Trailer.Get(gateway.HeaderContinued); got != "1" {
		t.Errorf("trailer %s %q, want 1: the stream was not continued (events %v)", gateway.HeaderContinued, got, kinds)
	}
}

// messagesRead is what a client read of a Messages stream: its events' types (a run
// of deltas as one), text deltas, output tokens and continued trailer.
type messagesRead struct {
	kinds   string
	deltas  []string
	output  int
	trailer string
}

// messagesThrough streams a Messages request through the gateway and reads it event
// by event.
func messagesThrough(t *testing.T, g runningGateway, body string) messagesRead {
	t.Helper()
	resp, err := http.Post(g.url+"/v1/messages", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var kinds []string
	var got messagesRead
	for _, ev := range readSSE(t, resp.Body) {
		var e chatstream.MessagesEvent
		if err := json.Unmarshal([]byte(ev.data), &e); err != nil || e.Type != ev.event {
			t.Fatalf("event %q: %s (%v)", ev.event, ev.data, err)
		}
		if e.Index != nil && *e.Index != 0 {
			t.Errorf("%s at index %d: want one block at 0", e.Type, *e.Index)
		}
		switch e.Type {
		case "ping":
			continue
		case "content_block_delta":
			got.deltas = append(got.deltas, e.Delta.Text)
		case "message_delta":
			got.output = e.Usage.OutputTokens
		}
		if k := len(kinds); k == 0 || kinds[k-1] != e.Type || e.Type != "content_block_delta" {
			kinds = append(kinds, e.Type)
		}
	}
	got.kinds, got.trailer = strings.Join(kinds, " "), resp.Trailer.Get(gateway.HeaderContinued)
	return got
}

// sseEvent is one event of a stream: its type and data.
type sseEvent struct{ event, data string }

// readSSE reads a stream's events; a line that is neither is an error.
func readSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		case line == "":
			if cur.data != "" {
				out = append(out, cur)
			}
			cur = sseEvent{}
		default:
			t.Errorf("line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMessagesPrefillContinued: a Messages stream of a request that ends with the
// client's own start of the answer, whose replica breaks mid-text, is continued on a
// real agent and runner, and the client reads it in the form of an uninterrupted
// answer: one text block at index 0 whose text up to the break is the start of the
// uninterrupted answer (greedy), one message_delta with the output tokens and
// message_stop. The continuation keeps the start of the answer as the
// closed turn the first replica rendered and sends the text the client had as the
// open turn after it. (The rest is not compared with the uninterrupted answer's: with
// random weights a continuation's logits differ from a decode's by enough to change
// the greedy pick, with or without a start of the answer.)
func TestMessagesPrefillContinued(t *testing.T) {
	g, proxy, second := breakingFleet(t, ggufsynth.Tiny(), "content_block_delta", 2)
	msgs := `{"role":"user","content":"Tell me a story about a river"},{"role":"assistant","content":"Once upon a time"}`
	body := fmt.Sprintf(`{"model":"tiny","stream":true,"max_tokens":%d,"temperature":0,"messages":[%s]}`, answerTokens, msgs)
	whole := messagesThrough(t, g, body)
	const want = "message_start content_block_start content_block_delta content_block_stop message_delta message_stop"
	if whole.kinds != want || whole.trailer != "" {
		t.Fatalf("uninterrupted: %+v, want events %s", whole, want)
	}
	// The break lands after the second text delta, or after the first when the
	// runner put the whole answer in one (its reader lagged).
	proxy.armed.Store(true)
	got := messagesThrough(t, g, body)
	if got.trailer != "1" {
		t.Fatalf("read %+v: the stream was not continued", got)
	}
	// The first replica's deltas before the break (the runner may put several
	// tokens in one when its reader lags) are the start of the uninterrupted answer;
	// the continuation writes the rest, unless they were the whole answer already
	// (then it is spent: it ends at once).
	sent, text, wholeText := strings.Join(got.deltas[:min(int(proxy.passed.Load()), len(got.deltas))], ""), strings.Join(got.deltas, ""), strings.Join(whole.deltas, "")
	if got.kinds != want || !strings.HasPrefix(wholeText, sent) || len(text) == len(sent) && sent != wholeText ||
		got.output == 0 || got.output > answerTokens {
		t.Errorf("continued: %+v, want events %s, the uninterrupted answer's start, more after it and 1 to %d output tokens (uninterrupted: %+v)",
			got, want, answerTokens, whole)
	}
	var cont struct {
		Messages []json.RawMessage `json:"messages"`
	}
	reqs := second.requests()
	if len(reqs) != 1 || json.Unmarshal([]byte(reqs[0]), &cont) != nil {
		t.Fatalf("the continuing replica got %q, want one continuation", reqs)
	}
	var wantMsgs []json.RawMessage
	_ = json.Unmarshal(fmt.Appendf(nil, `[%s,{"role":"assistant","content":%q}]`, msgs, sent), &wantMsgs)
	if b, w := must(json.Marshal(cont.Messages)), must(json.Marshal(wantMsgs)); !bytes.Equal(b, w) {
		t.Errorf("the continuation's messages %s, want %s", b, w)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// logprobsRead is what a client read of a Responses stream with logprobs: the
// tokens of the deltas' and of output_text.done's logprobs, the final response.
type logprobsRead struct {
	deltas, done []string
	final        *responses.Response
	hr           *http.Response
}

// readLogprobs streams TestResponsesLogprobsContinued's request through g and reads it
// whole, checking that each token has its two alternatives.
func readLogprobs(t *testing.T, g runningGateway) logprobsRead {
	t.Helper()
	var r logprobsRead
	stream := streamResponses(t, g, responses.ResponseNewParams{
		Input:       responses.ResponseNewParamsInputUnion{OfString: openai.String("Tell me a story about a river")},
		Include:     []responses.ResponseIncludable{responses.ResponseIncludableMessageOutputTextLogprobs},
		TopLogprobs: openai.Int(2)}, &r.hr)
	for stream.Next() {
		switch ev := stream.Current(); ev.Type {
		case "response.output_text.delta":
			for _, lp := range ev.AsResponseOutputTextDelta().Logprobs {
				if len(lp.TopLogprobs) != 2 {
					t.Errorf("token %q has %d alternatives, want 2", lp.Token, len(lp.TopLogprobs))
				}
				r.deltas = append(r.deltas, lp.Token)
			}
		case "response.output_text.done":
			for _, lp := range ev.AsResponseOutputTextDone().Logprobs {
				r.done = append(r.done, lp.Token)
			}
		case "response.completed", "response.incomplete":
			resp := ev.Response
			r.final = &resp
		case "error", "response.failed":
			t.Errorf("%s event: %s", ev.Type, ev.RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestResponsesLogprobsContinued: a Responses stream with its output text's logprobs
// (include message.output_text.logprobs, top_logprobs 2), whose replica breaks
// mid-text, is continued on a real agent and runner: its deltas' logprobs are the
// first replica's up to the break and the continuing replica's after it, each token
// once and none lost at the seam: the output_text.done event's and the response's
// logprobs are the deltas' in order, as many as the usage's output tokens, each with
// its two alternatives.
func TestResponsesLogprobsContinued(t *testing.T) {
	g, proxy, _ := breakingFleet(t, ggufsynth.Tiny(), "response.output_text.delta", 3)
	proxy.armed.Store(true)
	got := readLogprobs(t, g)
	deltas, done, final, hr := got.deltas, got.done, got.final, got.hr
	if final == nil || hr.Trailer.Get(gateway.HeaderContinued) != "1" {
		t.Fatalf("response %v, trailer %q: want a response continued once", final, hr.Trailer.Get(gateway.HeaderContinued))
	}
	var inResponse []string
	for _, lp := range final.Output[len(final.Output)-1].Content[0].Logprobs {
		inResponse = append(inResponse, lp.Token)
	}
	if len(deltas) <= 3 || !slices.Equal(done, deltas) || !slices.Equal(inResponse, deltas) || int64(len(deltas)) != final.Usage.OutputTokens {
		t.Errorf("logprobs of %d tokens on the deltas %q, %d on output_text.done, %d in the response; usage %+v: want the same tokens, "+
			"one a token", len(deltas), deltas, len(done), len(inResponse), final.Usage)
	}
}

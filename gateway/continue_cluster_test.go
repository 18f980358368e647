package gateway_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// breakingProxy passes an agent's answers on; the first one it stops after cutAfter
// events of the kind named, until release is closed, and then breaks its connection,
// as a replica whose runner dies mid-answer does.
type breakingProxy struct {
	agent    string
	kind     string
	cutAfter int
	stalled  chan struct{}
	release  chan struct{}
	first    atomic.Bool
}

func (p *breakingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+p.agent+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	cut := r.URL.Path == "/v1/responses" && p.first.CompareAndSwap(false, true)
	rc := http.NewResponseController(w)
	br := bufio.NewReader(resp.Body)
	seen := 0
	for {
		line, err := br.ReadString('\n')
		_, _ = io.WriteString(w, line)
		_ = rc.Flush()
		if err != nil {
			return
		}
		if cut && line == "event: "+p.kind+"\n" {
			seen++
		}
		if cut && seen == p.cutAfter && line == "\n" {
			close(p.stalled)
			<-p.release
			panic(http.ErrAbortHandler) // the connection breaks mid-stream
		}
	}
}

// TestResponsesReasoningContinued: a Responses stream whose replica breaks inside its
// reasoning item is continued on another replica (a real agent and runner) inside
// that item: the client, the official OpenAI client, reads one response, one
// reasoning item under one id at output index 0, sequence numbers without a gap,
// the item's done events and the final response carrying all the reasoning it read
// (before the break and after), one terminal event and the continued trailer.
func TestResponsesReasoningContinued(t *testing.T) {
	runner := os.Getenv(runnerproc.RunnerEnv)
	if runner == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	e := cluster(t)
	spec := ggufsynth.Tiny()
	spec.ChatTemplate = thinkingTemplate
	agent := startAgentOf(t, runner, spec)
	proxy := &breakingProxy{agent: agent, kind: "response.reasoning_text.delta", cutAfter: 3,
		stalled: make(chan struct{}), release: make(chan struct{})}
	ps := httptest.NewServer(proxy)
	t.Cleanup(ps.Close)

	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	macA, macB := "mac-a-"+f.ns, "mac-b-"+f.ns
	f.node(macA, metav1.ConditionTrue)
	f.node(macB, metav1.ConditionTrue)
	f.deployment("tiny", "", 2)
	f.replica("tiny-0", "tiny", macA)
	f.replica("tiny-1", "tiny", macB)
	f.setReplica("tiny-0", metav1.ConditionTrue, strings.TrimPrefix(ps.URL, "http://")) // the stream starts here
	f.setReplica("tiny-1", metav1.ConditionFalse, agent)
	g := startGateway(t, e, gateway.Config{})
	waitModel(t, g, "tiny", f.ns, 1)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() { // once the first replica has sent some reasoning, the second is Ready and the first breaks
		select {
		case <-proxy.stalled:
		case <-ctx.Done():
			return
		}
		f.setReplica("tiny-1", metav1.ConditionTrue, agent)
		waitModel(t, g, "tiny", f.ns, 2)
		close(proxy.release)
	}()

	const maxTokens = 24
	var hr *http.Response
	c := openai.NewClient(option.WithBaseURL(g.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	stream := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "tiny",
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Think about the sea.")},
		MaxOutputTokens: openai.Int(maxTokens), Temperature: openai.Float(0)}, option.WithResponseInto(&hr))
	defer stream.Close()
	var (
		kinds           []string
		deltas, doneTxt string
		ids, items      = map[string]bool{}, map[string]bool{}
		final           *responses.Response
	)
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != int64(len(kinds)) {
			t.Errorf("event %d (%s) has sequence number %d", len(kinds), ev.Type, ev.SequenceNumber)
		}
		kinds = append(kinds, ev.Type)
		switch ev.Type {
		case "response.created", "response.in_progress":
			ids[ev.Response.ID] = true
		case "response.output_item.added", "response.output_item.done":
			items[ev.Item.ID+" "+ev.Item.Type] = true
			if ev.Item.Type == "reasoning" && ev.OutputIndex != 0 {
				t.Errorf("%s: reasoning at output index %d", ev.Type, ev.OutputIndex)
			}
		case "response.reasoning_text.delta":
			deltas += ev.Delta
		case "response.reasoning_text.done":
			doneTxt = ev.Text
		case "response.completed", "response.incomplete":
			r := ev.Response
			final = &r
			ids[r.ID] = true
		case "error", "response.failed":
			t.Errorf("%s event: %s", ev.Type, ev.RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
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
	if u := final.Usage; u.OutputTokens == 0 || u.OutputTokens > maxTokens || u.InputTokens == 0 {
		t.Errorf("usage %+v, want 1 to %d output tokens and the prompt's", u, maxTokens)
	}
	if got := hr.Trailer.Get(gateway.HeaderContinued); got != "1" {
		t.Errorf("trailer %s %q, want 1: the stream was not continued (events %v)", gateway.HeaderContinued, got, kinds)
	}
}

package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
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

// choicesAgent answers a chat with n choices: the first request writes first[i] word
// by word for each choice i (interleaved), finishes the choices in finished and then
// ends as firstEnd says (cut, engine_stopped); a continuation (runnerapi.HeaderContinue,
// one choice) writes rest[its text], finishes it, and ends with a usage chunk, [DONE]
// and a usage trailer, or breaks if its text is in breakOn. Each word is a token.
type choicesAgent struct {
	first    [][]string
	finished map[int]bool
	firstEnd string
	rest     map[string][]string
	breakOn  map[string]bool

	mu    sync.Mutex
	conts []choiceCont
}

// choiceCont is what a continuation asked for.
type choiceCont struct {
	Text, Tokens string
	N            bool // the body had n
}

func (a *choicesAgent) serve(_ int, w http.ResponseWriter, r *http.Request) {
	var req struct {
		N        *int `json:"n"`
		Messages []runnerapi.Message
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Trailer", metering.Header)
	rc := http.NewResponseController(w)
	if r.Header.Get(runnerapi.HeaderContinue) != runnerapi.ContinueFinalMessage {
		fmt.Fprint(w, choiceEvent("chatcmpl-first", 0, roleDelta, ""))
		counts := make([]int, len(a.first))
		for k := 0; ; k++ {
			wrote := false
			for i, words := range a.first {
				if k < len(words) {
					counts[i]++
					fmt.Fprintf(w, "%s %d %d\n", runnerapi.TokenCountComment, i, counts[i])
					fmt.Fprint(w, choiceEvent("chatcmpl-first", i, content(words[k]), ""))
					wrote = true
				}
			}
			if !wrote {
				break
			}
		}
		for i := range a.first {
			if a.finished[i] {
				fmt.Fprint(w, choiceEvent("chatcmpl-first", i, `{}`, "stop"))
			}
		}
		_ = rc.Flush()
		if a.firstEnd == "engine_stopped" {
			fmt.Fprint(w, `data: {"error":{"message":"the engine stopped","type":"service_unavailable","code":"engine_stopped"}}`+"\n\n")
			return
		}
		conn, _, _ := rc.Hijack()
		conn.Close()
		return
	}
	last := string(req.Messages[len(req.Messages)-1].Content)
	tokens := r.Header.Get(runnerapi.HeaderContinuedTokens)
	a.mu.Lock()
	a.conts = append(a.conts, choiceCont{Text: last, Tokens: tokens, N: req.N != nil})
	a.mu.Unlock()
	fmt.Fprint(w, choiceEvent("chatcmpl-cont", 0, roleDelta, ""))
	for k, word := range a.rest[last] {
		fmt.Fprintf(w, "%s 0 %d\n", runnerapi.TokenCountComment, k+1)
		fmt.Fprint(w, choiceEvent("chatcmpl-cont", 0, content(word), ""))
	}
	_ = rc.Flush()
	if a.breakOn[last] {
		conn, _, _ := rc.Hijack()
		conn.Close()
		return
	}
	var sent int
	_, _ = fmt.Sscan(tokens, &sent)
	out := sent + len(a.rest[last])
	fmt.Fprint(w, choiceEvent("chatcmpl-cont", 0, `{}`, "stop"))
	fmt.Fprintf(w, `data: {"id":"chatcmpl-cont","object":"chat.completion.chunk","created":13,"model":"m","choices":[],`+
		`"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", out, 5+out)
	fmt.Fprint(w, "data: [DONE]\n\n")
	w.Header().Set(metering.Header, metering.Usage{Input: 5, Output: int64(out)}.String())
}

// choiceEvent is a chunk event of choice i.
func choiceEvent(id string, i int, delta, finish string) string {
	return strings.Replace(chunkEvent(id, delta, finish), `"choices":[{"index":0,`, fmt.Sprintf(`"choices":[{"index":%d,`, i), 1)
}

// choicesRead is what a client read of a stream with several choices.
type choicesRead struct {
	texts    map[int]string
	finishes map[int]int
	ids      map[string]bool
	usages   []runnerapi.Usage
	dones    int
	errMsg   string
}

func readChoices(t *testing.T, resp *http.Response) choicesRead {
	t.Helper()
	cr := choicesRead{texts: map[int]string{}, finishes: map[int]int{}, ids: map[string]bool{}}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			if sc.Text() != "" {
				t.Fatalf("not SSE: %q", sc.Text())
			}
			continue
		}
		if data == "[DONE]" {
			cr.dones++
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Index        int                      `json:"index"`
				Delta        struct{ Content string } `json:"delta"`
				FinishReason *string                  `json:"finish_reason"`
			} `json:"choices"`
			Usage *runnerapi.Usage          `json:"usage"`
			Error *struct{ Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if c.Error != nil {
			cr.errMsg = c.Error.Message
			continue
		}
		cr.ids[c.ID] = true
		for _, ch := range c.Choices {
			cr.texts[ch.Index] += ch.Delta.Content
			if ch.FinishReason != nil {
				cr.finishes[ch.Index]++
			}
		}
		if c.Usage != nil {
			cr.usages = append(cr.usages, *c.Usage)
		}
	}
	return cr
}

// TestStreamContinuationChoices: a Chat Completions stream with n > 1 whose replica
// fails is continued one choice at a time: each unfinished choice gets its own
// continuation (no n, its own text and token count) spliced under its own index, the
// finished choices are left as they were, and the client gets one usage chunk and
// one [DONE], the usage (and what is metered) counting every choice's tokens once.
func TestStreamContinuationChoices(t *testing.T) {
	for _, tc := range []struct {
		name    string
		agent   *choicesAgent
		opts    Options
		outcome string
		want    map[int]string
		conts   []choiceCont
		// tokens: the completion tokens the usage counts; broken: the stream ends
		// with an error.
		tokens int64
		broken bool
	}{
		{name: "two of three unfinished", agent: &choicesAgent{
			first:    [][]string{{"A", "a"}, {"B", "b", "b"}, {"C"}},
			finished: map[int]bool{0: true}, firstEnd: "cut",
			rest: map[string][]string{"Bbb": {"!", "!"}, "C": {"c", "c", "c"}}},
			outcome: splice.Continued, want: map[int]string{0: "Aa", 1: "Bbb!!", 2: "Cccc"},
			conts:  []choiceCont{{Text: "Bbb", Tokens: "3"}, {Text: "C", Tokens: "1"}},
			tokens: 2 + 5 + 4},
		{name: "engine stopped, the first choice unfinished", agent: &choicesAgent{
			first:    [][]string{{"A"}, {"B", "b"}},
			finished: map[int]bool{1: true}, firstEnd: "engine_stopped",
			rest: map[string][]string{"A": {"a"}}},
			outcome: splice.Continued, want: map[int]string{0: "Aa", 1: "Bb"},
			conts:  []choiceCont{{Text: "A", Tokens: "1"}},
			tokens: 2 + 2},
		// A choice's continuation that breaks is another break: with one continuation
		// allowed, the stream ends with the error, the choices after it not continued.
		{name: "a choice's continuation breaks", agent: &choicesAgent{
			first:    [][]string{{"A"}, {"B"}},
			firstEnd: "cut", rest: map[string][]string{"A": {"a"}, "B": {"b"}}, breakOn: map[string]bool{"A": true}},
			outcome: splice.Limit, want: map[int]string{0: "Aa", 1: "B"},
			conts: []choiceCont{{Text: "A", Tokens: "1"}}, broken: true},
		{name: "a choice's continuation breaks, two allowed", opts: Options{StreamContinuations: 2}, agent: &choicesAgent{
			first:    [][]string{{"A"}, {"B"}},
			firstEnd: "cut", rest: map[string][]string{"A": {"a"}, "Aa": {"."}, "B": {"b"}}, breakOn: map[string]bool{"A": true}},
			outcome: splice.Continued, want: map[int]string{0: "Aa.", 1: "Bb"},
			conts:  []choiceCont{{Text: "A", Tokens: "1"}, {Text: "Aa", Tokens: "2"}, {Text: "B", Tokens: "1"}},
			tokens: 3 + 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, tc.agent.serve)
			g := newTestGateway(t, tc.opts)
			g.serveReplicas(up.host(), up.host())
			resp, err := http.Post(g.url+"/v1/chat/completions", "application/json", strings.NewReader(fmt.Sprintf(
				`{"model":"m","stream":true,"n":%d,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"count"}]}`,
				len(tc.agent.first))))
			if err != nil {
				t.Fatal(err)
			}
			got := readChoices(t, resp)
			resp.Body.Close()
			if d := cmp.Diff(tc.want, got.texts); d != "" {
				t.Errorf("choices' texts (-want +got):\n%s", d)
			}
			if len(got.ids) != 1 || !got.ids["chatcmpl-first"] {
				t.Errorf("chunk ids %v, want the first stream's alone", got.ids)
			}
			tc.agent.mu.Lock()
			conts := tc.agent.conts
			tc.agent.mu.Unlock()
			if d := cmp.Diff(tc.conts, conts); d != "" {
				t.Errorf("continuations sent (-want +got):\n%s", d)
			}
			if tc.broken {
				if got.dones != 0 || got.errMsg == "" || len(got.usages) != 0 {
					t.Errorf("client read %+v, want the error, no usage and no [DONE]", got)
				}
			} else {
				for i := range tc.agent.first {
					if got.finishes[i] != 1 {
						t.Errorf("choice %d had %d finish_reasons, want 1", i, got.finishes[i])
					}
				}
				want := []runnerapi.Usage{{PromptTokens: 5, CompletionTokens: int(tc.tokens), TotalTokens: 5 + int(tc.tokens)}}
				if d := cmp.Diff(want, got.usages); got.dones != 1 || got.errMsg != "" || d != "" {
					t.Errorf("[DONE] %d times, error %q, usage chunks (-want +got):\n%s", got.dones, got.errMsg, d)
				}
				// The breaks continued, not the requests sent.
				if tr, want := resp.Trailer.Get(HeaderContinued), max(tc.opts.StreamContinuations, 1); tr != fmt.Sprint(want) {
					t.Errorf("trailer %s: %q, want %d", HeaderContinued, tr, want)
				}
			}
			testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
				n := testutil.ToFloat64(g.metrics.continuations.WithLabelValues("a/m", tc.outcome))
				return n == 1, fmt.Sprintf("stream_continuations_total{outcome=%q} = %v", tc.outcome, n)
			})
			if tc.broken {
				return
			}
			testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() (bool, string) {
				out := testutil.ToFloat64(g.metrics.usage.Tokens.WithLabelValues("", "", "a/m", metering.TypeOutput))
				dis := testutil.ToFloat64(g.metrics.countDisagreements.WithLabelValues("a/m"))
				return out == float64(tc.tokens) && dis == 0, fmt.Sprintf("metered output %v (want %d), count disagreements %v", out, tc.tokens, dis)
			})
		})
	}
}

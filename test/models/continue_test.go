package models_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/splice"
)

// continuedTokens is the length of the greedy answers a continuation is compared on.
const continuedTokens = 32

// TestStreamContinuedAfterAKill is the matrix row "a stream continued after its runner
// is killed": for each family, a greedy stream broken after an event (the bytes a
// killed runner's stream ends with) is continued on a fresh runner as the gateway
// continues it (package splice reads both parts and builds the continuation's body;
// the headers are the gateway's, the answer's token ids among them), and the client's
// tokens are the uninterrupted stream's, token for token. The breaks are the first
// where the answer's text re-tokenizes into other tokens than the model generated
// (where a continuation that re-tokenizes it parts from the stream: without the ids,
// qwen3moe, gpt-oss, gemma3 and qwen3next fail here), the middle of the answer, and
// its last event with text (the continuation only ends it). The client's text is the
// uninterrupted stream's too.
func TestStreamContinuedAfterAKill(t *testing.T) {
	eachFamily(t, func(t *testing.T, bin string, m tinyModel) {
		body, err := json.Marshal(map[string]any{"model": "test", "temperature": 0, "max_tokens": continuedTokens,
			"logprobs": true, "stream": true, "stream_options": map[string]bool{"include_usage": true},
			"messages": []map[string]string{{"role": "user", "content": prompt}}})
		if err != nil {
			t.Fatal(err)
		}
		first := startRunner(t, bin, m.path)
		raw := first.post(body, nil)
		whole := readEvents(t, raw)
		if whole.tokens() < 4 {
			t.Fatalf("the uninterrupted answer has %d tokens, want at least 4 to break it:\n%s", whole.tokens(), raw)
		}
		cuts, retokenized := breakPoints(t, first, whole)
		first.stop()
		for _, cut := range cuts {
			next := startRunner(t, bin, m.path)
			got := continueAfter(t, next, body, whole.rawUpTo(cut))
			next.stop()
			if w, g := strings.Join(whole.content, ""), strings.Join(got.content, ""); w != g {
				t.Errorf("broken after %d tokens, the client's text %q, want the uninterrupted %q", whole.tokensUpTo(cut), g, w)
			}
			if diff := cmp.Diff(whole.pieces(), got.pieces()); diff != "" {
				t.Errorf("broken after %d of %d tokens (re-tokenized there as other tokens: %v), the client's tokens "+
					"(-uninterrupted +continued):\n%s\nrunner log:\n%s", whole.tokensUpTo(cut), whole.tokens(), retokenized[cut], diff,
					next.stderr.String())
			}
			if u := got.usage; u == nil || u.CompletionTokens != whole.usage.CompletionTokens {
				t.Errorf("broken after %d tokens, the continuation's usage %+v, want %d completion tokens as uninterrupted",
					whole.tokensUpTo(cut), u, whole.usage.CompletionTokens)
			}
			used := !strings.Contains(next.stderr.String(), "part of the gateway's token ids")
			t.Logf("%s: broken after %d of %d tokens (re-tokenized as other tokens: %v), continued as generated: %v",
				m.family, whole.tokensUpTo(cut), whole.tokens(), retokenized[cut], used)
		}
	})
}

// post posts a streamed chat request with the gateway's count headers, and h, and
// returns its body.
func (r *modelRunner) post(body []byte, h http.Header) []byte {
	r.t.Helper()
	resp := r.send(body, h)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		r.t.Fatalf("stream: %d %s %v", resp.StatusCode, b, err)
	}
	return b
}

func (r *modelRunner) send(body []byte, h http.Header) *http.Response {
	r.t.Helper()
	req, err := http.NewRequestWithContext(r.t.Context(), http.MethodPost, r.base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header = h.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(runnerapi.HeaderTokenCounts, runnerapi.TokenCountComments)
	req.Header.Set(runnerapi.HeaderTokenIDs, runnerapi.TokenCountComments)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp
}

// streamed is a chat stream as events: each event's raw bytes, the tokens its
// logprobs carry (each one's bytes), its content, and the ids its count line names.
type streamed struct {
	raw     [][]byte
	toks    [][]string
	content []string
	ids     []int32
	usage   *runnerapi.Usage
}

// readEvents splits a stream's body into its events.
func readEvents(t *testing.T, raw []byte) streamed {
	t.Helper()
	var s streamed
	for ev := range bytes.SplitAfterSeq(raw, []byte("\n\n")) {
		if len(bytes.TrimSpace(ev)) == 0 {
			continue
		}
		s.raw = append(s.raw, ev)
		var toks []string
		content := ""
		for line := range strings.Lines(string(ev)) {
			line = strings.TrimRight(line, "\n")
			if rest, ok := strings.CutPrefix(line, runnerapi.TokenCountComment+" "); ok {
				f := strings.Fields(rest)
				if len(f) == 3 {
					ids, err := runnerapi.ParseTokenIDs(f[2])
					if err != nil {
						t.Fatalf("count line %q: %v", line, err)
					}
					s.ids = append(s.ids, ids...)
				}
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var c runnerapi.ChatCompletionChunk
			if err := json.Unmarshal([]byte(data), &c); err != nil {
				t.Fatalf("event %q: %v", data, err)
			}
			if c.Usage != nil {
				s.usage = c.Usage
			}
			for _, ch := range c.Choices {
				if ch.Delta.Content != nil {
					content += *ch.Delta.Content
				}
				if ch.Logprobs == nil {
					continue
				}
				for _, lp := range ch.Logprobs.Content {
					var b []byte
					for _, x := range lp.Bytes {
						b = append(b, byte(x))
					}
					toks = append(toks, string(b))
				}
			}
		}
		s.toks, s.content = append(s.toks, toks), append(s.content, content)
	}
	return s
}

// pieces is every token's bytes, in order.
func (s streamed) pieces() []string { return slices.Concat(s.toks...) }

func (s streamed) tokens() int { return len(s.pieces()) }

// tokensUpTo is the tokens of the events up to event e.
func (s streamed) tokensUpTo(e int) int { return len(slices.Concat(s.toks[:e+1]...)) }

// rawUpTo is the stream's bytes up to event e: what a runner killed right after
// sending it leaves.
func (s streamed) rawUpTo(e int) []byte { return bytes.Join(s.raw[:e+1], nil) }

// breakPoints are the events to break the stream after: the first whose content so
// far re-tokenizes (on r) into other tokens than the ids generated, the one in the
// middle of the answer, and the last with text (its continuation has every token and
// only ends it); retokenized says which did.
func breakPoints(t *testing.T, r *modelRunner, s streamed) ([]int, map[int]bool) {
	t.Helper()
	retokenized := map[int]bool{}
	var cuts []int
	middle, last := -1, -1
	for e := range s.raw {
		n := s.tokensUpTo(e)
		if n == s.tokens() && last < 0 && s.content[e] != "" && !bytes.Contains(s.raw[e], []byte(`"finish_reason":"`)) {
			last = e
		}
		if n == 0 || n >= s.tokens() || n > len(s.ids) {
			continue
		}
		if middle < 0 && n >= s.tokens()/2 {
			middle = e
		}
		if len(cuts) > 0 {
			continue
		}
		text := strings.Join(s.content[:e+1], "")
		if toks := r.tokenize(text); !slices.Equal(toks, s.ids[:n]) {
			retokenized[e] = true
			cuts = append(cuts, e)
		}
	}
	for _, e := range []int{middle, last} {
		if e >= 0 && !slices.Contains(cuts, e) {
			cuts = append(cuts, e)
		}
	}
	if len(cuts) == 0 {
		t.Fatalf("no event to break the stream after: %d events, %d tokens, %d ids", len(s.raw), s.tokens(), len(s.ids))
	}
	return cuts, retokenized
}

// tokenize is text's tokens on r, no BOS.
func (r *modelRunner) tokenize(text string) []int32 {
	r.t.Helper()
	b, _ := json.Marshal(runnerapi.TokenizeRequest{Content: &text, AddSpecial: new(false)})
	resp, err := http.Post(r.base+"/tokenize", "application/json", bytes.NewReader(b))
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out runnerapi.TokenizeResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		r.t.Fatalf("tokenize: %d %v", resp.StatusCode, err)
	}
	return out.Tokens
}

// continueAfter reads broken, a stream of the request body that broke, as the gateway
// does, continues it on r as the gateway would, and returns what the client got of
// both.
func continueAfter(t *testing.T, r *modelRunner, body, broken []byte) streamed {
	t.Helper()
	st := splice.New(splice.Chat)
	before, err := io.ReadAll(splice.NewReader(io.NopCloser(bytes.NewReader(broken)), st, false))
	brk, ok := errors.AsType[*splice.Break](err)
	if !ok {
		t.Fatalf("reading the broken stream: %v, want a break", err)
	}
	st.Broke("killed")
	c := splice.NewContinuation(brk, st, body, 1, time.Now().Add(time.Minute))
	if ok, why := c.Decide(time.Now()); !ok {
		t.Fatalf("the broken stream is not continued: %s", why)
	}
	c.Take()
	cbody, err := c.Body(body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage)
	if !st.TokensKnown() {
		t.Fatal("the runner's token counts are not known")
	}
	h.Set(runnerapi.HeaderContinuedTokens, strconv.FormatInt(st.SentTokens(), 10))
	if ids := st.SentTokenIDs(); ids != "" {
		h.Set(runnerapi.HeaderContinuedTokenIDs, ids)
	}
	resp := r.send(cbody, h)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("the continuation: %d %s", resp.StatusCode, b)
	}
	after, err := io.ReadAll(splice.NewReader(resp.Body, st, true))
	if err != nil {
		t.Fatalf("reading the continuation: %v", err)
	}
	return readEvents(t, append(before, after...))
}

package e2e

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// completeText runs a greedy non-streamed text completion and returns the choice.
func completeText(t *testing.T, r *runner, prompt string, maxTokens int, extra map[string]any) runnerapi.Completion {
	t.Helper()
	body := map[string]any{"prompt": prompt, "temperature": 0, "max_tokens": maxTokens}
	for k, v := range extra {
		body[k] = v
	}
	var c runnerapi.Completion
	if code := r.postJSON("/v1/completions", body, &c); code != http.StatusOK {
		t.Fatalf("completion: status %d", code)
	}
	if len(c.Choices) != 1 {
		t.Fatalf("completion has %d choices", len(c.Choices))
	}
	return c
}

func chatWhole(t *testing.T, r *runner, body any) runnerapi.ChatCompletion {
	t.Helper()
	var c runnerapi.ChatCompletion
	if code := r.postJSON("/v1/chat/completions", body, &c); code != http.StatusOK {
		t.Fatalf("chat: status %d", code)
	}
	return c
}

func TestGreedyGenerationIsDeterministic(t *testing.T) {
	m := model(t, "tiny")
	r1 := startReady(t, m)
	a := completeText(t, r1, "The quick brown fox", 24, nil)
	b := completeText(t, r1, "The quick brown fox", 24, nil)
	// Another process on the same file.
	r2 := startReady(t, m)
	c := completeText(t, r2, "The quick brown fox", 24, nil)

	if a.Choices[0].Text == "" {
		t.Fatal("empty completion")
	}
	if a.Choices[0].Text != b.Choices[0].Text || a.Choices[0].Text != c.Choices[0].Text {
		t.Errorf("greedy completions differ:\n%q\n%q\n%q", a.Choices[0].Text, b.Choices[0].Text, c.Choices[0].Text)
	}
	if got := *a.Choices[0].FinishReason; got != "length" {
		t.Errorf("finish_reason = %q, want length", got)
	}
	// CompletionTokensDetails: speculative decoding's counts (speculation_test.go).
	want := runnerapi.Usage{PromptTokens: a.Usage.PromptTokens, CompletionTokens: 24, TotalTokens: a.Usage.PromptTokens + 24,
		CompletionTokensDetails: a.Usage.CompletionTokensDetails}
	if d := cmp.Diff(want, *a.Usage); d != "" {
		t.Errorf("usage (-want +got):\n%s", d)
	}
	if a.Object != "text_completion" || !strings.HasPrefix(a.ID, "cmpl-") || a.Created == 0 || a.Model != "tiny" {
		t.Errorf("unexpected envelope: %+v", a)
	}
	// A different prompt leads somewhere else.
	if d := completeText(t, r1, "Something else entirely", 24, nil); d.Choices[0].Text == a.Choices[0].Text {
		t.Errorf("different prompts gave the same completion %q", a.Choices[0].Text)
	}
}

func TestSamplingIsSeeded(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	run := func(seed int) string {
		return completeText(t, r, "Once upon a time", 24, map[string]any{
			"temperature": 1.2, "top_k": 50, "top_p": 0.95, "min_p": 0.01, "seed": seed,
			"presence_penalty": 0.5, "frequency_penalty": 0.5,
		}).Choices[0].Text
	}
	a, b, c := run(7), run(7), run(8)
	if a != b {
		t.Errorf("same seed gave different text:\n%q\n%q", a, b)
	}
	if a == c {
		t.Errorf("different seeds gave the same text %q", a)
	}
}

func TestStopStringsAndMaxTokens(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	full := completeText(t, r, "abc def", 40, nil).Choices[0].Text
	runes := []rune(full)
	if len(runes) < 8 {
		t.Fatalf("completion too short to pick a stop string: %q", full)
	}
	stop := string(runes[4:7])
	want := full[:strings.Index(full, stop)]
	got := completeText(t, r, "abc def", 40, map[string]any{"stop": []string{"\x00never", stop}})
	if got.Choices[0].Text != want || *got.Choices[0].FinishReason != "stop" {
		t.Errorf("with stop %q: got %q (%s), want %q (stop)", stop, got.Choices[0].Text, *got.Choices[0].FinishReason, want)
	}
	short := completeText(t, r, "abc def", 3, nil)
	if short.Usage.CompletionTokens != 3 || *short.Choices[0].FinishReason != "length" {
		t.Errorf("max_tokens 3: usage %+v finish %s", short.Usage, *short.Choices[0].FinishReason)
	}
}

type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Logprobs     *runnerapi.ChatLogprobs `json:"logprobs"`
		FinishReason *string                 `json:"finish_reason"`
	} `json:"choices"`
	Usage *runnerapi.Usage     `json:"usage"`
	Error *runnerapi.ErrorBody `json:"-"`
}

// streamChat posts a streamed chat and returns the parsed chunks, the content, whether
// [DONE] arrived, and an error event if one ended the stream.
func streamChat(t *testing.T, r *runner, ctx context.Context, body map[string]any, onChunk func(chunk) bool) ([]chunk, string, bool, *runnerapi.ErrorBody) {
	t.Helper()
	resp, err := r.post(ctx, "/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
	var chunks []chunk
	var content strings.Builder
	var errEv *runnerapi.ErrorBody
	_, done, _ := readSSE(t, resp.Body, func(ev sseEvent) bool {
		if strings.HasPrefix(ev.data, `{"error"`) {
			errEv = &runnerapi.ErrorBody{}
			if err := json.Unmarshal([]byte(ev.data), errEv); err != nil {
				t.Fatalf("bad error event %q: %v", ev.data, err)
			}
			return false
		}
		var c chunk
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("bad chunk %q: %v", ev.data, err)
		}
		chunks = append(chunks, c)
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				content.WriteString(*ch.Delta.Content)
			}
		}
		return onChunk == nil || onChunk(c)
	})
	return chunks, content.String(), done, errEv
}

func TestStreamingFraming(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	whole := chatWhole(t, r, chatBody("Tell me a story", 20, false))

	body := chatBody("Tell me a story", 20, true)
	body["stream_options"] = map[string]any{"include_usage": true}
	chunks, content, done, errEv := streamChat(t, r, context.Background(), body, nil)
	if errEv != nil || !done {
		t.Fatalf("stream ended without [DONE] (error %+v)", errEv)
	}
	if content != whole.Choices[0].Message.Text() {
		t.Errorf("streamed content %q differs from the non-streamed %q", content, whole.Choices[0].Message.Text())
	}
	if len(chunks) < 4 {
		t.Fatalf("only %d chunks", len(chunks))
	}
	first, final, usage := chunks[0], chunks[len(chunks)-2], chunks[len(chunks)-1]
	if len(first.Choices) != 1 || first.Choices[0].Delta.Role != "assistant" {
		t.Errorf("first chunk does not carry the assistant role: %+v", first)
	}
	for i, c := range chunks {
		if c.ID != first.ID || c.Created != first.Created || c.Model != "test" || c.Object != "chat.completion.chunk" {
			t.Errorf("chunk %d envelope %+v differs from the first %+v", i, c, first)
		}
		if i < len(chunks)-2 && (len(c.Choices) != 1 || c.Choices[0].FinishReason != nil || c.Usage != nil) {
			t.Errorf("chunk %d: finish_reason or usage before the end: %+v", i, c)
		}
	}
	if !strings.HasPrefix(first.ID, "chatcmpl-") {
		t.Errorf("id %q", first.ID)
	}
	if len(final.Choices) != 1 || final.Choices[0].FinishReason == nil || *final.Choices[0].FinishReason != "length" {
		t.Errorf("final chunk has no finish_reason length: %+v", final)
	}
	if len(usage.Choices) != 0 || usage.Usage == nil {
		t.Fatalf("last chunk is not a usage chunk: %+v", usage)
	}
	// The streamed request reuses the prefix the first one left in the slot.
	wantUsage := runnerapi.Usage{PromptTokens: whole.Usage.PromptTokens, CompletionTokens: 20,
		TotalTokens:             whole.Usage.PromptTokens + 20,
		PromptTokensDetails:     &runnerapi.PromptTokensDetails{CachedTokens: whole.Usage.PromptTokens - 1},
		CompletionTokensDetails: usage.Usage.CompletionTokensDetails} // speculative decoding's counts (speculation_test.go)
	if d := cmp.Diff(wantUsage, *usage.Usage); d != "" {
		t.Errorf("stream usage (-want +got):\n%s", d)
	}

	// Without include_usage there is no usage chunk.
	chunks, _, done, _ = streamChat(t, r, context.Background(), chatBody("Tell me a story", 5, true), nil)
	if !done || chunks[len(chunks)-1].Usage != nil || len(chunks[len(chunks)-1].Choices) != 1 {
		t.Errorf("stream without include_usage ended with %+v", chunks[len(chunks)-1])
	}
}

func TestCompletionStreaming(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	whole := completeText(t, r, "Hello", 16, nil)
	resp, err := r.post(context.Background(), "/v1/completions", map[string]any{
		"prompt": "Hello", "temperature": 0, "max_tokens": 16, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var text strings.Builder
	var last runnerapi.Completion
	var finish string
	_, done, err := readSSE(t, resp.Body, func(ev sseEvent) bool {
		var c runnerapi.Completion
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("bad chunk %q: %v", ev.data, err)
		}
		if c.Object != "text_completion" {
			t.Errorf("object %q", c.Object)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		last = c
		return true
	})
	if err != nil || !done {
		t.Fatalf("stream: done=%v err=%v", done, err)
	}
	if text.String() != whole.Choices[0].Text || finish != "length" {
		t.Errorf("streamed %q (%s), want %q (length)", text.String(), finish, whole.Choices[0].Text)
	}
	if last.Usage == nil || last.Usage.CompletionTokens != 16 {
		t.Errorf("usage chunk %+v", last.Usage)
	}
}

// tieMargin is how close, in logprob, the best and the second-best token of a greedy
// step may be for a batch of another shape to pick the other one. llama.cpp's CPU
// matrix products are not bit-identical across batch sizes (a token decoded alone and
// one decoded beside others go through different kernels), so two near-tied logits may
// swap; a batching bug (a wrong position, another sequence's KV) moves logits by far
// more than this.
const tieMargin = 0.05

// greedyLogprobs is a greedy chat body that asks for each token with its runner-up.
func greedyLogprobs(prompt string, maxTokens int, stream bool) map[string]any {
	body := chatBody(prompt, maxTokens, stream)
	body["logprobs"], body["top_logprobs"] = true, 2
	return body
}

// soloGreedy runs prompt alone, not streamed, and returns its completion's tokens.
func soloGreedy(t *testing.T, r *runner, prompt string, maxTokens int) []runnerapi.TokenLogprob {
	t.Helper()
	var out struct {
		Choices []struct {
			Logprobs runnerapi.ChatLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	if code := r.postJSON("/v1/chat/completions", greedyLogprobs(prompt, maxTokens, false), &out); code != http.StatusOK || len(out.Choices) != 1 {
		t.Fatalf("solo completion of %q: status %d, %+v", prompt, code, out)
	}
	return out.Choices[0].Logprobs.Content
}

// departure says where got departs from the solo run's tokens: "" when it does not,
// or only at a step whose two best tokens were within tieMargin (then the rest is not
// compared: a different token changes everything after it).
func departure(solo, got []runnerapi.TokenLogprob) string {
	return departureWithin(solo, got, tieMargin)
}

// departureWithin is departure with the tie margin given.
func departureWithin(solo, got []runnerapi.TokenLogprob, tie float64) string {
	for k, tok := range solo {
		if k >= len(got) {
			return fmt.Sprintf("ends after %d tokens, alone it went on with %q", k, tok.Token)
		}
		if slices.Equal(tok.Bytes, got[k].Bytes) {
			continue
		}
		if len(tok.TopLogprobs) < 2 {
			return fmt.Sprintf("departs at token %d (%q) and the solo run has no runner-up for it", k, tok.Token)
		}
		margin := tok.TopLogprobs[0].Logprob - tok.TopLogprobs[1].Logprob
		if margin < tie {
			return ""
		}
		return fmt.Sprintf("departs at token %d: %q where alone %q led %q by %.4f", k, got[k].Token, tok.Token,
			tok.TopLogprobs[1].Token, margin)
	}
	if len(got) > len(solo) {
		return fmt.Sprintf("runs on past the solo run's %d tokens", len(solo))
	}
	return ""
}

// Concurrent greedy streams share one runner (one batch per step) and produce what
// each produces alone, but where the solo run's two best tokens were tied within
// tieMargin.
func TestConcurrentStreamsMatchAlone(t *testing.T) {
	for _, tc := range []struct {
		preset string // tiny has F32 weights, small F16 ones (another matmul path)
		n      int
	}{{"tiny", 2}, {"tiny", 4}, {"small", 4}} {
		n := tc.n
		t.Run(fmt.Sprintf("%s %d streams", tc.preset, n), func(t *testing.T) {
			r := startReady(t, model(t, tc.preset), "--parallel", "4", "--ctx", "4096")
			prompts := []string{"alpha beta", "The weather today", "Once upon a time in a land", "x"}[:n]
			alone := make([][]runnerapi.TokenLogprob, n)
			for i, p := range prompts {
				alone[i] = soloGreedy(t, r, p, 48)
			}
			// Drop the cached prefixes so the concurrent run prefills from scratch too.
			var cc runnerapi.CacheClear
			if code := r.postJSON("/cache/clear", nil, &cc); code != http.StatusOK {
				t.Fatalf("cache clear: %d", code)
			}

			// The comparison means something only if the streams shared the engine: on a
			// busy machine one may end before another starts, so a run that did not
			// overlap is run again (three runs at most). Two proofs of overlap: /status
			// polled while the streams run saw two busy slots, or two streams' chunks
			// interleaved on the wire (the runner flushes every token, so a stream whose
			// first chunk came before another's last one was decoded beside it). The
			// second one holds when the tiny model finishes between two polls.
			concurrent := func() (got [][]runnerapi.TokenLogprob, maxBusy int) {
				got = make([][]runnerapi.TokenLogprob, n)
				first, last := make([]time.Time, n), make([]time.Time, n)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i, p := range prompts {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						chunks, _, _, _ := streamChat(t, r, context.Background(), greedyLogprobs(p, 48, true), func(chunk) bool {
							if first[i].IsZero() {
								first[i] = time.Now()
							}
							last[i] = time.Now()
							return true
						})
						for _, c := range chunks {
							for _, ch := range c.Choices {
								if ch.Logprobs != nil {
									got[i] = append(got[i], ch.Logprobs.Content...)
								}
							}
						}
					}()
				}
				stopPoll := make(chan struct{})
				polled := make(chan struct{})
				go func() {
					defer close(polled)
					for {
						select {
						case <-stopPoll:
							return
						default:
						}
						var st runnerapi.Status
						if _, err := r.getJSON("/status", &st); err == nil && st.SlotsBusy > maxBusy {
							maxBusy = st.SlotsBusy
						}
						time.Sleep(2 * time.Millisecond)
					}
				}()
				close(start)
				wg.Wait()
				close(stopPoll)
				<-polled
				if interleaved := chunksInterleaved(first, last); interleaved > maxBusy {
					maxBusy = interleaved
				}
				return got, maxBusy
			}
			for run := 1; ; run++ {
				got, maxBusy := concurrent()
				for i := range got {
					if len(alone[i]) == 0 {
						t.Fatalf("stream %d (%q): the solo run returned no token logprobs", i, prompts[i])
					}
					if d := departure(alone[i], got[i]); d != "" {
						t.Errorf("stream %d (%q): concurrent, it %s", i, prompts[i], d)
					} else if len(got[i]) != len(alone[i]) || !slices.EqualFunc(got[i], alone[i], func(a, b runnerapi.TokenLogprob) bool { return slices.Equal(a.Bytes, b.Bytes) }) {
						t.Logf("stream %d departs from its solo run at a near tie (within %v)", i, tieMargin)
					}
				}
				if maxBusy >= 2 {
					break
				}
				if run == 3 {
					t.Fatalf("in %d runs at most %d stream(s) were decoded at once (busy slots polled, chunks interleaved); the streams did not overlap", run, maxBusy)
				}
				t.Logf("run %d: at most %d stream(s) decoded at once; running again", run, maxBusy)
				if code := r.postJSON("/cache/clear", nil, &cc); code != http.StatusOK {
					t.Fatalf("cache clear: %d", code)
				}
			}
		})
	}
}

// chunksInterleaved is how many streams were delivering at one instant: the most
// [first, last] chunk intervals that share a point.
func chunksInterleaved(first, last []time.Time) int {
	most := 0
	for _, at := range first {
		live := 0
		for j := range first {
			if !first[j].IsZero() && !first[j].After(at) && last[j].After(at) {
				live++
			}
		}
		most = max(most, live)
	}
	return most
}

func TestClientDisconnectFreesSlot(t *testing.T) {
	r := startReady(t, model(t, "tiny"), "--parallel", "2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := 0
	_, _, done, _ := streamChat(t, r, ctx, chatBody("keep talking", 100000, true), func(chunk) bool {
		got++
		if got == 3 {
			if st := r.status(); st.SlotsBusy != 1 || st.RequestsActive != 1 {
				t.Errorf("while streaming: slots_busy=%d requests_active=%d, want 1 and 1", st.SlotsBusy, st.RequestsActive)
			}
			cancel() // the client goes away mid-stream
			return false
		}
		return true
	})
	if done {
		t.Fatal("a 100000-token stream finished before the client left")
	}
	waitFor(t, 10*time.Second, "the slot to be freed", func() bool {
		st := r.status()
		return st.SlotsBusy == 0 && st.RequestsActive == 0
	})
	// The runner still serves.
	completeText(t, r, "still there?", 4, nil)
}

func TestErrors(t *testing.T) {
	r := startReady(t, model(t, "tiny"), "--ctx", "256", "--parallel", "2")
	long := strings.Repeat("word salad ", 400)
	tests := []struct {
		name       string
		path, body string
		wantStatus int
		wantCode   string
	}{
		{"bad json", "/v1/chat/completions", `{"messages": [`, 400, runnerapi.CodeInvalidJSON},
		{"trailing data", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]} {}`, 400, runnerapi.CodeInvalidJSON},
		{"wrong type", "/v1/chat/completions", `{"messages":"hi"}`, 400, runnerapi.CodeInvalidValue},
		{"no messages", "/v1/chat/completions", `{"messages":[]}`, 400, runnerapi.CodeInvalidValue},
		{"bad role", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"x"}]}`, 400, runnerapi.CodeInvalidValue},
		{"image part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, runnerapi.CodeInvalidValue},
		{"temperature", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"temperature":5}`, 400, runnerapi.CodeInvalidValue},
		{"n above the slots", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":3}`, 400, runnerapi.CodeInvalidValue},
		{"n above the limit", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":17}`, 400, runnerapi.CodeInvalidValue},
		{"unknown field", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"cache_prompt":true}`, 400, runnerapi.CodeUnknownParameter},
		{"tools without template support", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, 400, runnerapi.CodeUnsupportedParameter},
		{"completion suffix", "/v1/completions", `{"prompt":"x","suffix":"y"}`, 400, runnerapi.CodeUnsupportedParameter},
		{"max_tokens", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, 400, runnerapi.CodeInvalidValue},
		{"stream_options without stream", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`, 400, runnerapi.CodeInvalidValue},
		{"prompt too long", "/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, long), 400, runnerapi.CodeContextLengthExceeded},
		{"stream prompt too long", "/v1/chat/completions", fmt.Sprintf(`{"stream":true,"messages":[{"role":"user","content":%q}]}`, long), 400, runnerapi.CodeContextLengthExceeded},
		{"completion prompt too long", "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, long), 400, runnerapi.CodeContextLengthExceeded},
		{"no prompt", "/v1/completions", `{}`, 400, runnerapi.CodeInvalidValue},
		{"token out of vocab", "/v1/completions", `{"prompt":[1, 99999]}`, 400, runnerapi.CodeInvalidValue},
		{"embedding too long", "/v1/embeddings", fmt.Sprintf(`{"input":%q}`, long), 400, runnerapi.CodeContextLengthExceeded},
		{"embedding dims", "/v1/embeddings", `{"input":"x","dimensions":7}`, 400, runnerapi.CodeInvalidValue},
		{"embedding no input", "/v1/embeddings", `{}`, 400, runnerapi.CodeInvalidValue},
		{"negative limits", "/limits", `{"ceiling_bytes":-1}`, 400, runnerapi.CodeInvalidValue},
		{"tokenize nothing", "/tokenize", `{}`, 400, runnerapi.CodeInvalidValue},
		{"unknown path", "/v1/unknown", `{}`, 404, runnerapi.CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var eb runnerapi.ErrorBody
			if code := r.postJSON(tt.path, tt.body, &eb); code != tt.wantStatus || eb.Error.Code != tt.wantCode {
				t.Errorf("got %d %+v, want %d %s", code, eb.Error, tt.wantStatus, tt.wantCode)
			}
			if eb.Error.Message == "" || eb.Error.Type == "" {
				t.Errorf("error body lacks message or type: %+v", eb.Error)
			}
		})
	}
	t.Run("method not allowed", func(t *testing.T) {
		var eb runnerapi.ErrorBody
		code, err := r.getJSON("/v1/chat/completions", &eb)
		if err != nil || code != http.StatusMethodNotAllowed || eb.Error.Code != runnerapi.CodeMethodNotAllowed {
			t.Errorf("GET chat: %d %+v %v", code, eb, err)
		}
	})
	// Nothing above broke the runner.
	completeText(t, r, "fine", 2, nil)
}

func TestEmbeddings(t *testing.T) {
	r := startReady(t, model(t, "tiny"), "--parallel", "2")
	var resp runnerapi.EmbeddingResponse
	type floats struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
		Usage runnerapi.Usage `json:"usage"`
	}
	var f floats
	if code := r.postJSON("/v1/embeddings", map[string]any{"input": []string{"hello world", "something else"}}, &f); code != 200 {
		t.Fatalf("embeddings: %d", code)
	}
	if len(f.Data) != 2 || f.Data[0].Index != 0 || f.Data[1].Index != 1 {
		t.Fatalf("data: %+v", f.Data)
	}
	for i, d := range f.Data {
		if len(d.Embedding) != ggufsynth.Tiny().Embd {
			t.Errorf("embedding %d has %d dims, want %d", i, len(d.Embedding), ggufsynth.Tiny().Embd)
		}
		var n float64
		for _, v := range d.Embedding {
			n += float64(v) * float64(v)
		}
		if math.Abs(math.Sqrt(n)-1) > 1e-3 {
			t.Errorf("embedding %d has norm %v, want 1", i, math.Sqrt(n))
		}
	}
	if cmp.Equal(f.Data[0].Embedding, f.Data[1].Embedding) {
		t.Error("different inputs gave the same embedding")
	}
	if f.Usage.PromptTokens == 0 || f.Usage.TotalTokens != f.Usage.PromptTokens {
		t.Errorf("usage %+v", f.Usage)
	}
	// The same input again (alone, single string) gives the same vector, and base64
	// carries the same floats.
	var g floats
	r.postJSON("/v1/embeddings", map[string]any{"input": "hello world"}, &g)
	if d := cmp.Diff(f.Data[0].Embedding, g.Data[0].Embedding, cmpopts.EquateApprox(0, 1e-6)); d != "" {
		t.Errorf("embedding not reproducible:\n%s", d)
	}
	if code := r.postJSON("/v1/embeddings", map[string]any{"input": "hello world", "encoding_format": "base64"}, &resp); code != 200 {
		t.Fatalf("base64: %d", code)
	}
	raw, err := base64.StdEncoding.DecodeString(resp.Data[0].Embedding.(string))
	if err != nil {
		t.Fatal(err)
	}
	dec := make([]float32, len(raw)/4)
	for i := range dec {
		dec[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	if d := cmp.Diff(f.Data[0].Embedding, dec); d != "" {
		t.Errorf("base64 embedding differs:\n%s", d)
	}
}

func TestTokenize(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	var tr runnerapi.TokenizeResponse
	if code := r.postJSON("/tokenize", map[string]any{"content": "ab"}, &tr); code != 200 {
		t.Fatalf("tokenize: %d", code)
	}
	if tr.Count != len(tr.Tokens) || tr.Count < 2 || tr.Tokens[0] != ggufsynth.BOSToken {
		t.Errorf("tokenize content: %+v", tr)
	}
	var chat runnerapi.TokenizeResponse
	r.postJSON("/tokenize", map[string]any{"messages": []map[string]string{{"role": "user", "content": "ab"}}}, &chat)
	var starts, ends int
	for _, tok := range chat.Tokens {
		switch tok {
		case ggufsynth.IMStartToken:
			starts++
		case ggufsynth.IMEndToken:
			ends++
		}
	}
	// user turn + generation prompt: two <|im_start|>, one <|im_end|>.
	if starts != 2 || ends != 1 || chat.Tokens[0] != ggufsynth.BOSToken {
		t.Errorf("chat tokens %v: %d im_start, %d im_end", chat.Tokens, starts, ends)
	}
	// The chat prompt's token count is what a completion reports.
	c := chatWhole(t, r, chatBody("ab", 1, false))
	if c.Usage.PromptTokens != chat.Count {
		t.Errorf("chat usage prompt_tokens %d, tokenize count %d", c.Usage.PromptTokens, chat.Count)
	}
}

func TestPrefixReuse(t *testing.T) {
	r := startReady(t, model(t, "tiny"), "--parallel", "2")
	first := chatWhole(t, r, chatBody("a long shared system prompt and a question", 8, false))
	second := chatWhole(t, r, chatBody("a long shared system prompt and a question", 8, false))
	if first.Usage.PromptTokensDetails != nil {
		t.Errorf("first request reported cached tokens: %+v", first.Usage.PromptTokensDetails)
	}
	if second.Usage.PromptTokensDetails == nil || second.Usage.PromptTokensDetails.CachedTokens != second.Usage.PromptTokens-1 {
		t.Errorf("second request: usage %+v, want all but the last prompt token cached", second.Usage)
	}
	if first.Choices[0].Message.Text() != second.Choices[0].Message.Text() {
		t.Errorf("reused prefix changed the output: %q vs %q", first.Choices[0].Message.Text(), second.Choices[0].Message.Text())
	}
	st := r.status()
	if st.KVCellsUsed == 0 || st.SlotsBusy != 0 {
		t.Errorf("status after two requests: %+v", st)
	}
	var cc runnerapi.CacheClear
	if code := r.postJSON("/cache/clear", nil, &cc); code != 200 || cc.EntriesCleared != 1 {
		t.Errorf("cache clear: %d %+v", code, cc)
	}
	if st := r.status(); st.KVCellsUsed != 0 {
		t.Errorf("kv_cells_used %d after cache clear", st.KVCellsUsed)
	}
}

func TestLimitsRefusePrefill(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	st := r.status()
	if st.FootprintBytes <= 0 || st.Model == nil || st.Model.KVBytesPerToken <= 0 {
		t.Fatalf("status lacks footprint or model: %+v", st)
	}
	// A ceiling just above the current footprint leaves room for a short prompt only.
	ceiling := st.FootprintBytes + 64*st.Model.KVBytesPerToken
	var l runnerapi.Limits
	if code := r.postJSON("/limits", runnerapi.Limits{CeilingBytes: ceiling}, &l); code != 200 || l.CeilingBytes != ceiling {
		t.Fatalf("limits: %d %+v", code, l)
	}
	long := strings.Repeat("lorem ipsum ", 60) // well over 64 tokens
	for _, stream := range []bool{false, true} {
		var eb runnerapi.ErrorBody
		body := chatBody(long, 4, stream)
		if code := r.postJSON("/v1/chat/completions", body, &eb); code != http.StatusRequestEntityTooLarge ||
			eb.Error.Code != runnerapi.CodePrefillMemoryExceeded || eb.Error.LimitBytes != ceiling || eb.Error.EstimatedBytes <= 0 {
			t.Errorf("stream=%v: got %d %+v, want 413 %s", stream, code, eb.Error, runnerapi.CodePrefillMemoryExceeded)
		}
	}
	// The runner refuses work, it does not die; a ceiling far above the footprint (the
	// guard's constant-time path) and no ceiling at all both restore service.
	if code := r.postJSON("/limits", runnerapi.Limits{CeilingBytes: st.FootprintBytes + 1<<30}, nil); code != 200 {
		t.Fatalf("limits: %d", code)
	}
	completeText(t, r, long, 2, nil)
	r.postJSON("/limits", runnerapi.Limits{CeilingBytes: 0}, nil)
	completeText(t, r, long, 2, nil)
}

// TestLimitsReclaimGarbageBeforeRefusing: a refused request leaves tens of MiB of
// garbage on the runner's heap (its body, its decoded fields) that the footprint
// counts until the runtime returns it; under a ceiling just above the runner's live
// footprint, the next ordinary prefill is admitted, not refused for that garbage.
func TestLimitsReclaimGarbageBeforeRefusing(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	st := r.status()
	if st.Model == nil || st.Model.KVBytesPerToken <= 0 {
		t.Fatalf("status lacks the model: %+v", st)
	}
	junk := map[string]any{"max_tokens": 2, "messages": []map[string]string{{"role": strings.Repeat("x", 40<<20), "content": "hi"}}}
	var refused runnerapi.ErrorBody
	if code := r.postJSON("/v1/chat/completions", junk, &refused); code != http.StatusBadRequest || len(refused.Error.Message) > 256 {
		t.Fatalf("a 40 MiB role: %d with a %d-byte message, want 400 quoting a clipped role", code, len(refused.Error.Message))
	}
	grown := r.status().FootprintBytes
	if grown-st.FootprintBytes < 32<<20 {
		t.Skipf("the refused request left %d bytes on the footprint: nothing to reclaim", grown-st.FootprintBytes)
	}
	ceiling := st.FootprintBytes + 16<<20
	if code := r.postJSON("/limits", runnerapi.Limits{CeilingBytes: ceiling}, nil); code != 200 {
		t.Fatalf("limits: %d", code)
	}
	var eb runnerapi.ErrorBody
	if code := r.postJSON("/v1/chat/completions", chatBody("hello", 2, false), &eb); code != http.StatusOK {
		t.Errorf("after %d MiB of garbage, under a ceiling %d MiB above the live footprint: %d %+v",
			(grown-st.FootprintBytes)>>20, (ceiling-st.FootprintBytes)>>20, code, eb.Error)
	}
	if fp := r.status().FootprintBytes; fp > ceiling {
		t.Errorf("footprint %d after the reclaim, ceiling %d", fp, ceiling)
	}
}

func TestAbortEndsRunningAndQueuedRequests(t *testing.T) {
	r := startReady(t, model(t, "tiny"), "--parallel", "1")
	queued := make(chan *runnerapi.ErrorBody, 1)
	n := 0
	_, _, done, errEv := streamChat(t, r, context.Background(), chatBody("go on forever", 100000, true), func(chunk) bool {
		n++
		if n == 2 {
			// A second request waits for the only slot.
			go func() {
				var eb runnerapi.ErrorBody
				code := r.postJSON("/v1/chat/completions", chatBody("me next", 4, false), &eb)
				if code != http.StatusServiceUnavailable {
					t.Errorf("queued request: status %d, want 503", code)
				}
				queued <- &eb
			}()
			waitFor(t, 10*time.Second, "the second request to queue", func() bool {
				st := r.status()
				return st.RequestsActive == 2 && st.SlotsBusy == 1
			})
			var a runnerapi.Abort
			if code := r.postJSON("/abort", nil, &a); code != 200 || a.Aborted != 2 {
				t.Errorf("abort: %d %+v, want 2 aborted", code, a)
			}
		}
		return true
	})
	if done || errEv == nil || errEv.Error.Code != runnerapi.CodeAborted {
		t.Fatalf("aborted stream ended with done=%v error=%+v", done, errEv)
	}
	if eb := <-queued; eb.Error.Code != runnerapi.CodeAborted {
		t.Errorf("queued request ended with %+v", eb.Error)
	}
	waitFor(t, 10*time.Second, "the runner to be idle", func() bool {
		st := r.status()
		return st.SlotsBusy == 0 && st.RequestsActive == 0
	})
	completeText(t, r, "after abort", 2, nil)
}

func TestSIGTERMMidStream(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	n := 0
	_, _, done, errEv := streamChat(t, r, context.Background(), chatBody("talk until stopped", 100000, true), func(chunk) bool {
		n++
		if n == 2 {
			if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}
		return true
	})
	if done || errEv == nil || errEv.Error.Code != runnerapi.CodeShuttingDown {
		t.Errorf("stream ended with done=%v error=%+v, want a %s error event", done, errEv, runnerapi.CodeShuttingDown)
	}
	if code := r.exitCode(15 * time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
}

func TestShutdownEndpointAndUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "r.sock")
	r := startReady(t, model(t, "tiny"), "--socket", sock, "--alias", "served-name")
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %s: %v mode %v, want 0600", sock, err, fi.Mode())
	}
	c := completeText(t, r, "over a socket", 3, map[string]any{"model": "ignored"})
	if c.Model != "served-name" {
		t.Errorf("model %q, want the alias", c.Model)
	}
	resp, err := r.post(context.Background(), "/shutdown", nil)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("shutdown: %v %v", resp, err)
	}
	resp.Body.Close()
	if code := r.exitCode(15 * time.Second); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

func TestStatusDescribesTheModel(t *testing.T) {
	m := model(t, "tiny")
	r := startReady(t, m, "--parallel", "4", "--ctx", "1024")
	st := r.status()
	spec := ggufsynth.Tiny()
	fi, _ := os.Stat(m)
	want := runnerapi.ModelInfo{
		Path: m, SizeBytes: fi.Size(), NCtxTrain: spec.Ctx, NEmbd: spec.Embd, NLayer: spec.Layers,
		NHead: spec.Heads, NHeadKV: spec.KVHeads, NVocab: spec.Vocab, KVType: "f16", ChatTemplate: true,
		KVBytesPerToken: int64(spec.KVBytesPerToken(2)),
	}
	if d := cmp.Diff(want, *st.Model); d != "" {
		t.Errorf("status model (-want +got):\n%s", d)
	}
	if st.State != runnerapi.StateReady || st.SlotsTotal != 4 || st.KVCellsTotal != 1024 || st.PID != r.cmd.Process.Pid {
		t.Errorf("status %+v", st)
	}
}

func TestLoadFailureAndBadFlags(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "garbage.gguf")
	if err := os.WriteFile(bad, []byte("this is not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := startRunner(t, bad)
	h := r.loadFailed(10 * time.Second)
	if h.Error == "" {
		t.Error("failed health has no error message")
	}
	if code := r.exitCode(10 * time.Second); code != 3 {
		t.Errorf("exit code %d after a failed load, want 3", code)
	}

	bin := runnerBinary(t)
	for _, args := range [][]string{
		{},
		{"--model", bad},
		{"--model", bad, "--addr", "127.0.0.1:0", "--socket", "/tmp/x"},
		{"--model", bad, "--addr", "127.0.0.1:0", "--kv-type", "f8"},
		{"--model", bad, "--addr", "127.0.0.1:0", "--parallel", "8", "--batch", "4"},
		{"--model", bad, "--addr", "127.0.0.1:0", "--no-such-flag"},
	} {
		cmd := exec.Command(bin, args...)
		if err := cmd.Run(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 {
			t.Errorf("args %q: %v, want exit code 2", args, err)
		}
	}
	// A flag that would change nothing is refused, naming what it needs.
	for args, want := range map[string]string{
		"--draft-device metal": "want auto, cpu or gpu",
		"--draft-device cpu":   "--draft-device needs --draft",
	} {
		var stderr strings.Builder
		cmd := exec.Command(bin, append([]string{"--model", bad, "--addr", "127.0.0.1:0"}, strings.Fields(args)...)...)
		cmd.Stderr = &stderr
		if err := cmd.Run(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 || !strings.Contains(stderr.String(), want) {
			t.Errorf("args %q: %v, stderr %q; want exit code 2 and %q", args, err, stderr.String(), want)
		}
	}
}

func TestOpenAIClient(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	client := openai.NewClient(option.WithBaseURL(r.base+"/v1/"), option.WithAPIKey("unused"),
		option.WithHTTPClient(r.client), option.WithMaxRetries(0))
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:       "tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello from the official client")},
		MaxTokens:   openai.Int(12),
		Temperature: openai.Float(0),
	}
	c, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) != 1 || c.Choices[0].FinishReason != "length" || c.Usage.CompletionTokens != 12 {
		t.Errorf("completion %+v", c)
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := acc.Choices[0].Message.Content; got != c.Choices[0].Message.Content {
		t.Errorf("streamed %q, non-streamed %q", got, c.Choices[0].Message.Content)
	}
	if acc.Usage.CompletionTokens != 12 {
		t.Errorf("streamed usage %+v", acc.Usage)
	}
	emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: "tiny", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("vector please")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(emb.Data) != 1 || len(emb.Data[0].Embedding) != ggufsynth.Tiny().Embd {
		t.Errorf("embeddings %+v", emb.Data)
	}
	// Errors come back typed.
	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}, Temperature: openai.Float(9)})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 {
		t.Errorf("bad temperature: %v", err)
	}
}

// A runner whose parent (the agent) dies stops by itself instead of holding memory.
func TestExitsWithParent(t *testing.T) {
	bin := runnerBinary(t)
	m := model(t, "tiny")
	sh := exec.Command("sh", "-c", `"$0" --model "$1" --addr 127.0.0.1:0 --threads 1 2>/dev/null & wait`, bin, m)
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	// The listening line names the runner's pid; once it is printed the runner watches
	// its parent.
	var ev runnerapi.ListeningEvent
	if err := json.NewDecoder(out).Decode(&ev); err != nil || ev.PID == 0 {
		t.Fatalf("listening line: %+v %v", ev, err)
	}
	pid := ev.PID
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	alive := func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		// The state follows the parenthesised command name; a zombie has exited.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		return len(f) > 0 && f[0] != "Z"
	}
	if !alive() {
		t.Skip("cannot observe processes through /proc")
	}
	_ = sh.Process.Kill()
	_ = sh.Wait()
	waitFor(t, 15*time.Second, "the orphaned runner to exit", func() bool { return !alive() })
}

// Embedding inputs share batches with generations and still give the same vectors.
func TestEmbeddingsWhileGenerating(t *testing.T) {
	r := startReady(t, model(t, "tiny"), "--parallel", "3")
	type floats struct {
		Data []struct {
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
	}
	input := map[string]any{"input": []string{"first input", strings.Repeat("a longer second input ", 20)}}
	var alone floats
	if code := r.postJSON("/v1/embeddings", input, &alone); code != 200 {
		t.Fatalf("embeddings: %d", code)
	}
	n := 0
	var during floats
	_, _, done, _ := streamChat(t, r, context.Background(), chatBody("generate meanwhile", 100000, true), func(chunk) bool {
		n++
		if n == 2 {
			if code := r.postJSON("/v1/embeddings", input, &during); code != 200 {
				t.Errorf("embeddings during a stream: %d", code)
			}
			return false
		}
		return true
	})
	if done {
		t.Fatal("the stream ended before the embeddings were computed")
	}
	// Micro-batches split differently beside a generation, which may move the last
	// bit of a few elements; anything more is a bug.
	if d := cmp.Diff(alone, during, cmpopts.EquateApprox(0, 1e-6)); d != "" {
		t.Errorf("embeddings computed beside a generation differ (-alone +during):\n%s", d)
	}
}

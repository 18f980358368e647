package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// BenchmarkRunnerMid measures the runner on the mid model (≈175 MiB, 92M parameters):
// single-stream decode, aggregate decode of 4 concurrent streams, prefill and time to
// first token. Threads come from $MACFLEET_BENCH_THREADS (default 2).
//
//	MACFLEET_RUNNER=bin/macfleet-runner go test -run '^$' -bench RunnerMid -benchtime 3x ./test/runner
func BenchmarkRunnerMid(b *testing.B) {
	r := startReady(b, model(b, "mid"), "--parallel", "4", "--ctx", "8192", "--threads", benchThreads("2"))
	const genTokens = 128

	b.Run("decode-1-stream", func(b *testing.B) {
		var rate float64
		for range b.N {
			s := timedStream(b, r, fmt.Sprintf("%d decode", benchRound.Add(1)), genTokens)
			rate += s.decodeRate()
		}
		b.ReportMetric(rate/float64(b.N), "tok/s")
	})
	b.Run("decode-4-streams", func(b *testing.B) {
		var agg, per float64
		for range b.N {
			a, p := fourStreams(b, r, genTokens)
			agg, per = agg+a, per+p
		}
		b.ReportMetric(agg/float64(b.N), "aggregate-tok/s")
		b.ReportMetric(per/float64(b.N), "per-stream-tok/s")
	})
	b.Run("prefill", func(b *testing.B) {
		var rate float64
		for range b.N {
			// A fresh prompt each time so no cached prefix is reused.
			prompt := fmt.Sprintf("round %d: %s", benchRound.Add(1), strings.Repeat("lorem ipsum dolor sit amet ", 60))
			start := time.Now()
			c := completeTextB(b, r, prompt, 1)
			rate += float64(c.Usage.PromptTokens) / time.Since(start).Seconds()
		}
		b.ReportMetric(rate/float64(b.N), "tok/s")
	})
	b.Run("ttft", func(b *testing.B) {
		var ttft time.Duration
		for range b.N {
			s := timedStream(b, r, fmt.Sprintf("%d first token", benchRound.Add(1)), 1)
			ttft += s.ttft
		}
		b.ReportMetric(float64(ttft.Microseconds())/1000/float64(b.N), "ms")
	})
}

// fourStreams decodes four streams at once and returns their aggregate rate (tokens
// over the wall time) and the mean of their own decode rates.
func fourStreams(b testing.TB, r *runner, genTokens int) (agg, per float64) {
	var wg sync.WaitGroup
	stats := make([]streamStats, 4)
	start := time.Now()
	for k := range stats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stats[k] = timedStream(b, r, fmt.Sprintf("%d stream", benchRound.Add(1)), genTokens)
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	total := 0
	for _, s := range stats {
		total += s.tokens
		per += s.decodeRate() / 4
	}
	return float64(total) / wall.Seconds(), per
}

// benchThreads is $MACFLEET_BENCH_THREADS, else def.
func benchThreads(def string) string {
	if t := os.Getenv("MACFLEET_BENCH_THREADS"); t != "" {
		return t
	}
	return def
}

// benchRound makes every benchmark prompt unique (no prefix reuse across runs).
var benchRound atomic.Int64

type streamStats struct {
	ttft        time.Duration // request sent → first content chunk
	first, last time.Time     // first and last content chunk
	tokens      int           // completion tokens (usage)
}

// decodeRate is tokens per second after the first token (prefill excluded).
func (s streamStats) decodeRate() float64 {
	d := s.last.Sub(s.first).Seconds()
	if d <= 0 || s.tokens < 2 {
		return 0
	}
	return float64(s.tokens-1) / d
}

func timedStream(b testing.TB, r *runner, prompt string, maxTokens int) streamStats {
	b.Helper()
	return timedStreamWith(b, r, prompt, maxTokens, nil)
}

// timedStreamWith is timedStream with extra request fields.
func timedStreamWith(b testing.TB, r *runner, prompt string, maxTokens int, extra map[string]any) streamStats {
	b.Helper()
	body := chatBody(prompt, maxTokens, true)
	for k, v := range extra {
		body[k] = v
	}
	body["stream_options"] = map[string]any{"include_usage": true}
	start := time.Now()
	resp, err := r.post(context.Background(), "/v1/chat/completions", body)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
	var s streamStats
	_, done, err := readSSE(b, resp.Body, func(ev sseEvent) bool {
		var c struct {
			Choices []struct {
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *runnerapi.Usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			b.Fatalf("chunk %q: %v", ev.data, err)
		}
		if c.Usage != nil {
			s.tokens = c.Usage.CompletionTokens
		}
		if len(c.Choices) > 0 && c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
			now := time.Now()
			if s.first.IsZero() {
				s.first, s.ttft = now, now.Sub(start)
			}
			s.last = now
		}
		return true
	})
	if err != nil || !done {
		b.Fatalf("stream ended early: %v", err)
	}
	return s
}

func completeTextB(b testing.TB, r *runner, prompt string, maxTokens int) runnerapi.Completion {
	b.Helper()
	var c runnerapi.Completion
	if code := r.postJSON("/v1/completions", map[string]any{"prompt": prompt, "temperature": 0, "max_tokens": maxTokens}, &c); code != http.StatusOK {
		b.Fatalf("completion: %d", code)
	}
	return c
}

// BenchmarkGrammarMid measures decode under a grammar against free decode on the mid
// model, the cases interleaved in each round so that load on the machine hits all of
// them alike: a JSON answer whose tokens are mostly string content (the grammar
// usually allows the sampler's first choice: the fast path), and one that is all
// structure (numbers and enums: the grammar rejects most first choices of a
// random-weight model, so nearly every token masks the whole vocabulary).
//
//	MACFLEET_RUNNER=bin/macfleet-runner go test -run '^$' -bench GrammarMid -benchtime 5x ./test/runner
func BenchmarkGrammarMid(b *testing.B) {
	threads := os.Getenv("MACFLEET_BENCH_THREADS")
	if threads == "" {
		threads = "1"
	}
	r := startReady(b, model(b, "mid"), "--ctx", "4096", "--threads", threads)
	const genTokens = 128
	format := func(schema string) map[string]any {
		return map[string]any{"response_format": map[string]any{"type": "json_schema",
			"json_schema": map[string]any{"name": "bench", "schema": json.RawMessage(schema)}}}
	}
	cases := []struct {
		name  string
		extra map[string]any
	}{
		{"free", nil},
		{"json-string-content", format(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)},
		{"json-all-structure", format(`{"type":"array","minItems":12,"maxItems":12,"items":{"type":"object",
			"properties":{"n":{"type":"integer","minimum":0,"maximum":999},"c":{"enum":["red","green","blue"]},"b":{"type":"boolean"}},
			"required":["n","c","b"],"additionalProperties":false}}`)},
	}
	rates := make([]float64, len(cases))
	for i := range b.N {
		for k := range cases {
			tc := cases[(i+k)%len(cases)]
			s := timedStreamWith(b, r, fmt.Sprintf("%d grammar", benchRound.Add(1)), genTokens, tc.extra)
			rates[(i+k)%len(cases)] += s.decodeRate() / float64(b.N)
		}
	}
	for k, tc := range cases {
		b.ReportMetric(rates[k], tc.name+"-tok/s")
		if k > 0 {
			b.ReportMetric(rates[k]/rates[0], tc.name+"-x-free")
		}
	}
}

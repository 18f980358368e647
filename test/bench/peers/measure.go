package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/macfleet/macfleet/test/support/chatstream"
)

// chat streams a chat completion through the OpenAI API both servers speak
// (test/support/chatstream). It samples (temperature 0.8, a fixed seed) rather than decoding
// greedily: greedy decoding of a random-weight model soon repeats one token, and the
// peer cuts such a stream short without a finish chunk or [DONE] (after 30 repeats),
// which would time nothing comparable.
func (s *server) chat(ctx context.Context, prompt string, maxTokens int) (chatstream.Result, error) {
	return chatstream.Do(ctx, s.client, s.base, s.name,
		chatstream.Request{Model: modelName, Prompt: prompt, MaxTokens: maxTokens, Temperature: 0.8, Seed: 1}, nil)
}

// bench runs the measurements against the servers, each request bounded by timeout.
type bench struct {
	maxTokens int
	long      []int // words of each long prompt
	timeout   time.Duration
	nonce     int
	mu        sync.Mutex
}

// The jobs' names: "decode1", "streams<N>" (the aggregate of N streams), "ttftShort",
// "ttftLong<I>" (the Ith long prompt) and "cold"; each job's samples are under keys of
// the same names, and the long prompts' token counts under longCountKey.

func streamsJob(n int) string { return "streams" + strconv.Itoa(n) }

// streamsOf is the number of streams of a streams job.
func streamsOf(job string) (int, bool) {
	rest, ok := strings.CutPrefix(job, "streams")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n > 0
}

func longJob(i int) string { return "ttftLong" + strconv.Itoa(i) }

func longCountKey(i int) string { return "longPromptTokens" + strconv.Itoa(i) }

// prompt is a prompt unique to this run and call (so no server reuses a cached
// prefix) followed by words filler words.
func (b *bench) prompt(text string, words int) string {
	b.mu.Lock()
	b.nonce++
	n := b.nonce
	b.mu.Unlock()
	var sb strings.Builder
	fmt.Fprintf(&sb, "Request %d. %s", n, text)
	for i := range words {
		sb.WriteString(" ")
		sb.WriteString(filler[(i*7+n)%len(filler)])
	}
	return sb.String()
}

var filler = strings.Fields("the fleet of machines serves models to teams who ask questions about weather " +
	"trains rivers cities music numbers gardens history science stories and code every day")

// run measures one job on one server and returns the samples it yields, by metric key.
func (b *bench) run(ctx context.Context, s *server, job string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	if n, ok := streamsOf(job); ok {
		return b.streams(ctx, s, job, n)
	}
	if rest, ok := strings.CutPrefix(job, "ttftLong"); ok {
		i, err := strconv.Atoi(rest)
		if err != nil || i < 0 || i >= len(b.long) {
			return nil, fmt.Errorf("unknown job %q", job)
		}
		st, err := s.chat(ctx, b.prompt("Summarise this:", b.long[i]), 4)
		if err != nil {
			return nil, err
		}
		// The prompt's length as each server counts it goes into the table's notes: a
		// server that truncated or templated it differently would show here.
		return map[string]float64{job: ms(st.TTFT), longCountKey(i): float64(st.PromptTokens)}, nil
	}
	switch job {
	case "decode1":
		st, err := s.chat(ctx, b.prompt("Tell a long story about the sea.", 0), b.maxTokens)
		if err != nil {
			return nil, err
		}
		if st.CompletionTokens < min(b.maxTokens, 8) {
			return nil, fmt.Errorf("%s: generated %d of %d tokens: too few to time", s.name, st.CompletionTokens, b.maxTokens)
		}
		return map[string]float64{"decode1": st.DecodeRate()}, nil
	case "ttftShort":
		st, err := s.chat(ctx, b.prompt("Hello! What can you do?", 0), 4)
		if err != nil {
			return nil, err
		}
		return map[string]float64{"ttftShort": ms(st.TTFT)}, nil
	case "cold":
		// Unload (timed), then the first token of a short chat from nothing loaded.
		t0 := time.Now()
		if err := s.unload(ctx); err != nil {
			return nil, err
		}
		unload := time.Since(t0)
		st, err := s.chat(ctx, b.prompt("Hello! What can you do?", 0), 4)
		if err != nil {
			return nil, err
		}
		return map[string]float64{"unload": ms(unload), "cold": ms(st.TTFT)}, nil
	}
	return nil, fmt.Errorf("unknown job %q", job)
}

// streams is the aggregate decode of n concurrent streams: every stream's tokens over
// the time from the first token of any stream to the end of the last one.
func (b *bench) streams(ctx context.Context, s *server, job string, n int) (map[string]float64, error) {
	var wg sync.WaitGroup
	streams := make([]chatstream.Result, n)
	errs := make([]error, n)
	for i := range streams {
		wg.Go(func() {
			streams[i], errs[i] = s.chat(ctx, b.prompt("Tell a long story about the mountains.", 0), b.maxTokens)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	first, last, tokens := streams[0].Start.Add(streams[0].TTFT), streams[0].Start.Add(streams[0].Finish), 0
	for _, st := range streams {
		first = minTime(first, st.Start.Add(st.TTFT))
		last = maxTime(last, st.Start.Add(st.Finish))
		tokens += st.CompletionTokens
	}
	if d := last.Sub(first); d > 0 {
		return map[string]float64{job: float64(tokens) / d.Seconds()}, nil
	}
	return nil, fmt.Errorf("%s: %d streams took no time", s.name, n)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

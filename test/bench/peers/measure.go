package main

import (
	"context"
	"errors"
	"fmt"
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
	maxTokens  int
	longPrompt int // words of the long prompt
	timeout    time.Duration
	nonce      int
	mu         sync.Mutex
}

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
	case "decode4":
		var (
			wg      sync.WaitGroup
			streams [4]chatstream.Result
			errs    [4]error
		)
		for i := range streams {
			wg.Go(func() {
				streams[i], errs[i] = s.chat(ctx, b.prompt("Tell a long story about the mountains.", 0), b.maxTokens)
			})
		}
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil {
			return nil, err
		}
		// Aggregate decode: every stream's tokens over the time from the first token of
		// any stream to the end of the last one.
		first, last, tokens := streams[0].Start.Add(streams[0].TTFT), streams[0].Start.Add(streams[0].Finish), 0
		for _, st := range streams {
			first = minTime(first, st.Start.Add(st.TTFT))
			last = maxTime(last, st.Start.Add(st.Finish))
			tokens += st.CompletionTokens
		}
		if d := last.Sub(first); d > 0 {
			return map[string]float64{"decode4": float64(tokens) / d.Seconds()}, nil
		}
		return nil, fmt.Errorf("%s: four streams took no time", s.name)
	case "ttftShort":
		st, err := s.chat(ctx, b.prompt("Hello! What can you do?", 0), 4)
		if err != nil {
			return nil, err
		}
		return map[string]float64{"ttftShort": ms(st.TTFT)}, nil
	case "ttftLong":
		st, err := s.chat(ctx, b.prompt("Summarise this:", b.longPrompt), 4)
		if err != nil {
			return nil, err
		}
		// The prompt's length as each server counts it goes into the table's notes: a
		// server that truncated or templated it differently would show here.
		return map[string]float64{"ttftLong": ms(st.TTFT), "longPromptTokens": float64(st.PromptTokens)}, nil
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

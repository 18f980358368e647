package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// stream is the timing of one streamed chat completion.
type stream struct {
	start, first, finish time.Time
	promptTokens         int
	completionTokens     int
}

func (s stream) ttft() time.Duration { return s.first.Sub(s.start) }

// decodeRate is tokens per second after the first: completion tokens minus one over
// the time from the first text to the end.
func (s stream) decodeRate() float64 {
	d := s.finish.Sub(s.first)
	if d <= 0 || s.completionTokens < 2 {
		return 0
	}
	return float64(s.completionTokens-1) / d.Seconds()
}

// chat streams a chat completion through the OpenAI API both servers speak, asking for
// its usage; the stream must end with [DONE] and report it. It samples (temperature
// 0.8, a fixed seed) rather than decoding greedily: greedy decoding of a random-weight
// model soon repeats one token, and the peer cuts such a stream short without a finish
// chunk or [DONE] (about 30 repeats), which would time nothing comparable.
func (s *server) chat(ctx context.Context, prompt string, maxTokens int) (stream, error) {
	body, err := json.Marshal(map[string]any{
		"model": modelName, "messages": []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": maxTokens, "temperature": 0.8, "seed": 1, "stream": true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	if err != nil {
		return stream{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return stream{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	st := stream{start: time.Now()}
	resp, err := s.client.Do(req)
	if err != nil {
		return st, fmt.Errorf("%s: %w", s.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return st, fmt.Errorf("%s: %s: %s", s.name, resp.Status, tail(b.String(), 500))
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	// Shown if the stream breaks: how many events came, the last one and the last line
	// that was not an event.
	var (
		last, lastEvent []byte
		events          int
	)
	for {
		line, err := br.ReadSlice('\n')
		at := time.Now()
		if err != nil {
			return st, fmt.Errorf("%s: the stream (%s, %s) ended without [DONE] (%w) after %d events, the last %q, and %q",
				s.name, resp.Status, resp.Header.Get("Content-Type"), err, events, tail(string(lastEvent), 300), tail(string(last)+string(line), 300))
		}
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: "))
		if !ok {
			if len(bytes.TrimSpace(line)) > 0 {
				last = append(last[:0], line...)
			}
			continue
		}
		if string(data) == "[DONE]" {
			break
		}
		events++
		lastEvent = append(lastEvent[:0], data...)
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &c); err != nil {
			return st, fmt.Errorf("%s: bad event %q: %w", s.name, tail(string(data), 200), err)
		}
		if c.Error != nil {
			return st, fmt.Errorf("%s: error event: %s", s.name, c.Error.Message)
		}
		if c.Usage != nil {
			st.promptTokens, st.completionTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" && st.first.IsZero() {
				st.first = at
			}
			if ch.FinishReason != nil {
				st.finish = at
			}
		}
	}
	if st.first.IsZero() || st.finish.IsZero() || st.completionTokens == 0 {
		return st, fmt.Errorf("%s: the stream had no text, no finish reason or no usage (%d completion tokens)", s.name, st.completionTokens)
	}
	return st, nil
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
		if st.completionTokens < min(b.maxTokens, 8) {
			return nil, fmt.Errorf("%s: generated %d of %d tokens: too few to time", s.name, st.completionTokens, b.maxTokens)
		}
		return map[string]float64{"decode1": st.decodeRate()}, nil
	case "decode4":
		var (
			wg      sync.WaitGroup
			streams [4]stream
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
		first, last, tokens := streams[0].first, streams[0].finish, 0
		for _, st := range streams {
			if st.first.Before(first) {
				first = st.first
			}
			if st.finish.After(last) {
				last = st.finish
			}
			tokens += st.completionTokens
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
		return map[string]float64{"ttftShort": ms(st.ttft())}, nil
	case "ttftLong":
		st, err := s.chat(ctx, b.prompt("Summarise this:", b.longPrompt), 4)
		if err != nil {
			return nil, err
		}
		// The prompt's length as each server counts it goes into the table's notes: a
		// server that truncated or templated it differently would show here.
		return map[string]float64{"ttftLong": ms(st.ttft()), "longPromptTokens": float64(st.promptTokens)}, nil
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
		return map[string]float64{"unload": ms(unload), "cold": ms(st.ttft())}, nil
	}
	return nil, fmt.Errorf("unknown job %q", job)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Package chatstream sends one streamed OpenAI chat completion and times it: when the
// request went out, the first text, every text chunk and the finish, with the usage the
// server reports. It is the client the benchmarks time servers with (test/bench/engine
// against the runner and the agent, test/bench/peers against a peer server).
package chatstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Request is a one-message chat completion.
type Request struct {
	Model       string
	Prompt      string
	MaxTokens   int
	Temperature float64
	Seed        int64
	// Header holds extra request headers.
	Header http.Header
}

// Result is the timing of one streamed completion, every offset from Start, the moment
// the request was sent.
type Result struct {
	Start time.Time
	// TTFT is the offset of the first chunk carrying text.
	TTFT time.Duration
	// Pieces are the offsets of every chunk carrying text.
	Pieces []time.Duration
	// Finish is the offset of the chunk carrying finish_reason.
	Finish           time.Duration
	FinishReason     string
	PromptTokens     int
	CompletionTokens int
	Text             string
}

// DecodeRate is tokens per second after the first: completion tokens minus one over
// the time from the first text to the finish chunk.
func (r Result) DecodeRate() float64 {
	d := r.Finish - r.TTFT
	if d <= 0 || r.CompletionTokens < 2 {
		return 0
	}
	return float64(r.CompletionTokens-1) / d.Seconds()
}

// Gaps are the inter-token latencies: the time between consecutive text chunks.
func (r Result) Gaps() []time.Duration {
	var out []time.Duration
	for i := 1; i < len(r.Pieces); i++ {
		out = append(out, r.Pieces[i]-r.Pieces[i-1])
	}
	return out
}

// Do streams req to base's /v1/chat/completions, asking for the usage. onPiece, when
// set, is called after every text chunk with the number of chunks so far. The stream
// must end with [DONE], carry text and a finish reason and report its usage; errors
// name the server (name). A stream that breaks off names the events before the break.
func Do(ctx context.Context, client *http.Client, base, name string, req Request, onPiece func(n int)) (Result, error) {
	hreq, err := newHTTPRequest(ctx, base, req)
	if err != nil {
		return Result{}, err
	}
	r := Result{Start: time.Now()}
	resp, err := client.Do(hreq)
	if err != nil {
		return r, fmt.Errorf("%s: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return r, fmt.Errorf("%s: %s: %s", name, resp.Status, tail(string(b), 500))
	}
	if err := readStream(&r, resp.Body, name, onPiece); err != nil {
		return r, err
	}
	switch {
	case r.CompletionTokens == 0:
		return r, fmt.Errorf("%s: the stream reported no usage", name)
	case len(r.Pieces) == 0 || r.FinishReason == "":
		return r, fmt.Errorf("%s: the stream had %d text chunks and finish reason %q", name, len(r.Pieces), r.FinishReason)
	}
	return r, nil
}

// newHTTPRequest is the streamed chat completion request of req to base, asking for
// the usage.
func newHTTPRequest(ctx context.Context, base string, req Request) (*http.Request, error) {
	body, err := json.Marshal(map[string]any{
		"model": req.Model, "messages": []map[string]string{{"role": "user", "content": req.Prompt}},
		"max_tokens": req.MaxTokens, "temperature": req.Temperature, "seed": req.Seed, "stream": true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range req.Header {
		hreq.Header[k] = vs
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	return hreq, nil
}

// readStream reads the event stream up to [DONE] into r, timing each event from r.Start.
func readStream(r *Result, body io.Reader, name string, onPiece func(n int)) error {
	var (
		text            strings.Builder
		br              = bufio.NewReaderSize(body, 64<<10)
		events          int
		lastEvent, last []byte // shown if the stream breaks off
	)
	for {
		line, err := br.ReadSlice('\n')
		at := time.Since(r.Start)
		if err != nil {
			return fmt.Errorf("%s: the stream ended without [DONE] (%w) after %d events, the last %q, then %q",
				name, err, events, tail(string(lastEvent), 300), tail(string(last)+string(line), 300))
		}
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: "))
		if !ok {
			if len(bytes.TrimSpace(line)) > 0 {
				last = append(last[:0], line...)
			}
			continue // the blank line between events
		}
		if string(data) == "[DONE]" {
			break
		}
		events++
		lastEvent = append(lastEvent[:0], data...)
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return fmt.Errorf("%s: bad event %q: %w", name, tail(string(data), 300), err)
		}
		if c.Error != nil {
			return fmt.Errorf("%s: error event: %s", name, c.Error.Message)
		}
		addChunk(r, &c, at, &text, onPiece)
	}
	r.Text = text.String()
	return nil
}

// addChunk records one event, at offset at: its usage, its text pieces (appended to text)
// and its finish.
func addChunk(r *Result, c *chunk, at time.Duration, text *strings.Builder, onPiece func(n int)) {
	if c.Usage != nil {
		r.PromptTokens, r.CompletionTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
	}
	for _, ch := range c.Choices {
		if ch.Delta.Content != "" {
			if len(r.Pieces) == 0 {
				r.TTFT = at
			}
			r.Pieces = append(r.Pieces, at)
			text.WriteString(ch.Delta.Content)
			if onPiece != nil {
				onPiece(len(r.Pieces))
			}
		}
		if ch.FinishReason != nil {
			r.Finish, r.FinishReason = at, *ch.FinishReason
		}
	}
}

// chunk is what Do reads of a chat.completion.chunk.
type chunk struct {
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

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Cache keys a caller may send as prompt_cache_key (-cache-key).
const (
	keyNone   = "none"   // no key: affinity hashes the conversation's start
	keyUser   = "user"   // the user's thread id, as a coding agent sends its thread's
	keyTenant = "tenant" // the tenant's, as a caller that knows its users share a prefix
)

// cacheKey is the prompt_cache_key of user u of tenant t under the policy ("" for none).
func cacheKey(policy string, t, u int) string {
	switch policy {
	case keyUser:
		return fmt.Sprintf("tenant-%d-user-%d", t, u)
	case keyTenant:
		return fmt.Sprintf("tenant-%d", t)
	}
	return ""
}

// chatBody is user u of tenant t's streamed chat request, greedy: the tenant's system
// prompt, the user's message, the cache key and the tenant's cache_salt (its own cache
// partition: its prefixes are never another tenant's hit).
func chatBody(model, system, key string, t, u, maxTokens int) []byte {
	body := map[string]any{
		"model": model, "max_tokens": maxTokens, "temperature": 0, "stream": true,
		"stream_options": map[string]bool{"include_usage": true},
		"cache_salt":     fmt.Sprintf("tenant-%d", t),
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": userMessage(t, u)},
		},
	}
	if key != "" {
		body["prompt_cache_key"] = key
	}
	b, _ := json.Marshal(body)
	return b
}

// streamChunk is what the benchmark reads of a streamed chunk.
type streamChunk struct {
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// send posts one streamed chat request and measures it: TTFT at the first data line,
// the usage from the last chunk that carries it.
func send(ctx context.Context, hc *http.Client, url string, body []byte, o *outcome, epoch time.Time) {
	start := time.Now()
	o.Start = start.Sub(epoch)
	defer func() { o.End = time.Since(epoch) }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		o.Err = err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		o.Err = err.Error()
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		o.Err = fmt.Sprintf("%s: %s", resp.Status, msg)
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if o.TTFT == 0 {
			o.TTFT = time.Since(start)
		}
		if data == "[DONE]" {
			break
		}
		var c streamChunk
		if json.Unmarshal([]byte(data), &c) == nil && c.Usage != nil {
			o.Prompt, o.Completion = c.Usage.PromptTokens, c.Usage.CompletionTokens
			if d := c.Usage.PromptTokensDetails; d != nil {
				o.Cached = d.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		o.Err = err.Error()
	} else if o.TTFT == 0 || o.Prompt == 0 {
		o.Err = "no streamed chunk or no usage"
	}
}

// runLoad sends the workload to the gateway at url, each request at its arrival time
// (open loop: an arrival does not wait for earlier answers), each bounded by
// reqTimeout, and returns the outcomes in arrival order.
func runLoad(ctx context.Context, url, model, keys string, w workload, maxTokens int, reqTimeout time.Duration) []outcome {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	outs := make([]outcome, len(w.Requests))
	epoch := time.Now()
	var wg sync.WaitGroup
	for i, r := range w.Requests {
		select {
		case <-ctx.Done():
			for j := i; j < len(outs); j++ {
				outs[j] = outcome{Tenant: w.Requests[j].Tenant, User: w.Requests[j].User, Err: "not sent: " + ctx.Err().Error()}
			}
			wg.Wait()
			return outs
		case <-time.After(time.Until(epoch.Add(r.At))):
		}
		outs[i] = outcome{Tenant: r.Tenant, User: r.User}
		body := chatBody(model, w.Systems[r.Tenant], cacheKey(keys, r.Tenant, r.User), r.Tenant, r.User, maxTokens)
		wg.Add(1)
		go func(o *outcome) {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, reqTimeout)
			defer cancel()
			send(rctx, hc, url, body, o, epoch)
		}(&outs[i])
	}
	wg.Wait()
	return outs
}

// defaultClient sends the readiness probes.
var defaultClient = &http.Client{Timeout: time.Minute}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// shapeStreams is how many streams of one shape TestShapedStreamsSurviveARunnerKill
// sends at once: more than both replicas' slots (n = 2 takes two each).
const shapeStreams = 16

// storySchema bounds the answer (a random-weight model under it closes the object
// well within shapeTokens) while keeping it long enough for the kill to land in it.
const storySchema = `{"type":"object","properties":{"story":{"type":"string","maxLength":300}},"required":["story"],"additionalProperties":false}`

// shapeTokens caps each choice's output.
const shapeTokens = 600

// TestShapedStreamsSurviveARunnerKill: Chat Completions streams with n = 2, and
// streams under a JSON schema (response_format), through the gateway to a two-replica
// deployment, one replica's runner killed with SIGKILL while they stream: every
// stream completes as an uninterrupted one does; with n = 2 each choice has its own
// text and one finish_reason and the one usage counts every choice's tokens once,
// and an answer under the schema parses as JSON of it.
func TestShapedStreamsSurviveARunnerKill(t *testing.T) {
	t.Run("n=2", func(t *testing.T) {
		surviveWith(t, shapeStreams, shapedStream(`"n":2,`), killRunner, 3, nil)
	})
	t.Run("json_schema", func(t *testing.T) {
		surviveWith(t, shapeStreams, shapedStream(fmt.Sprintf(
			`"response_format":{"type":"json_schema","json_schema":{"name":"story","strict":true,"schema":%s}},`, storySchema)), killRunner, 3, nil)
	})
}

// shapedStream streams one chat with the request fields extra and checks it as a
// client would parse it, choice by choice.
func shapedStream(extra string) streamer {
	return func(ctx context.Context, model string, i int, streaming *atomic.Int32) streamResult {
		body := fmt.Sprintf(`{"model":%q,"stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,"temperature":0,%s
			"logprobs":true,"messages":[{"role":"user","content":"Story %d: tell me a very long story about the sea."}]}`,
			model, shapeTokens, extra, i)
		resp, problem := postStream(ctx, "/v1/chat/completions", body)
		if problem != "" {
			return streamResult{err: problem}
		}
		defer resp.Body.Close()
		var (
			texts     = map[int]*strings.Builder{}
			finishes  = map[int]string{}
			ids       = map[string]bool{}
			usages    int
			delivered int
			counted   bool
			usage     runnerapi.Usage
		)
		var inner string // what was wrong inside a chunk
		dones, problem := readChunks(resp.Body, func(c runnerapi.ChatCompletionChunk) {
			ids[c.ID] = true
			if c.Usage != nil {
				usages++
				usage = *c.Usage
			}
			for _, ch := range c.Choices {
				if texts[ch.Index] == nil {
					texts[ch.Index] = &strings.Builder{}
				}
				if ch.Delta.Content != nil {
					texts[ch.Index].WriteString(*ch.Delta.Content)
				}
				if ch.Logprobs != nil {
					delivered += len(ch.Logprobs.Content)
				}
				if ch.FinishReason != nil {
					if finishes[ch.Index] != "" {
						inner = fmt.Sprintf("choice %d finished twice", ch.Index)
					}
					finishes[ch.Index] = *ch.FinishReason
					if *ch.FinishReason == "stop" {
						delivered++ // the end-of-generation token, which has no logprob
					}
				}
			}
			if !counted && len(c.Choices) > 0 && c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
				counted = true
				streaming.Add(1)
			}
		})
		if problem += inner; problem != "" {
			return streamResult{err: problem}
		}
		res := streamResult{continued: resp.Trailer.Get("X-Macfleet-Continued")}
		n := 1
		if strings.Contains(extra, `"n":2`) {
			n = 2
		}
		switch {
		case dones != 1 || usages != 1 || len(ids) != 1 || len(finishes) != n || len(texts) != n:
			res.err = fmt.Sprintf("%d [DONE], %d usage chunks, ids %v, finishes %v of %d choices; want one each", dones, usages, ids, finishes, len(texts))
		case usage.CompletionTokens != delivered || usage.CompletionTokens > n*shapeTokens ||
			usage.TotalTokens != usage.PromptTokens+usage.CompletionTokens:
			res.err = fmt.Sprintf("usage %+v, the client got %d tokens (finishes %v, continued %q)", usage, delivered, finishes, res.continued)
		}
		if res.err == "" && strings.Contains(extra, "json_schema") {
			var v struct{ Story *string }
			if finishes[0] != "stop" || json.Unmarshal([]byte(texts[0].String()), &v) != nil || v.Story == nil {
				res.err = fmt.Sprintf("answer %q (finish %q, continued %q) is not JSON of the schema", texts[0].String(), finishes[0], res.continued)
			}
		}
		return res
	}
}

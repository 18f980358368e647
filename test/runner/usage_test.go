package e2e

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// TestPromptUsageOnTheFirstChunk: with runnerapi.HeaderPromptUsage, a stream that asks for
// usage has the prompt's usage (prompt and cached tokens, no completion yet) on its
// first chunk as well as the whole usage on its last; without it, only on the last.
func TestPromptUsageOnTheFirstChunk(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	body := chatBody("Tell me a story about a river", 6, true)
	body["stream_options"] = map[string]any{"include_usage": true}
	stream := func(header bool) []runnerapi.ChatCompletionChunk {
		var hdr []string
		if header {
			hdr = []string{runnerapi.HeaderPromptUsage, "first-chunk"}
		}
		resp := postChat(t, r, body, hdr...)
		defer resp.Body.Close()
		var chunks []runnerapi.ChatCompletionChunk
		_, done, err := readSSE(t, resp.Body, func(ev sseEvent) bool {
			var c runnerapi.ChatCompletionChunk
			if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
				t.Fatalf("bad chunk %q: %v", ev.data, err)
			}
			chunks = append(chunks, c)
			return true
		})
		if err != nil || !done || len(chunks) < 3 {
			t.Fatalf("stream: %d chunks, done %v, %v", len(chunks), done, err)
		}
		return chunks
	}
	plain := stream(false)
	if plain[0].Usage != nil {
		t.Errorf("without the header the first chunk has usage %+v", plain[0].Usage)
	}
	for i := range 2 { // the second time, the prompt is in the slot's cache
		chunks := stream(true)
		first, last := chunks[0], chunks[len(chunks)-1]
		if first.Usage == nil || last.Usage == nil {
			t.Fatalf("request %d: first chunk usage %+v, last %+v", i+1, first.Usage, last.Usage)
		}
		want := runnerapi.Usage{PromptTokens: last.Usage.PromptTokens, TotalTokens: last.Usage.PromptTokens,
			PromptTokensDetails: last.Usage.PromptTokensDetails}
		if d := cmp.Diff(want, *first.Usage); d != "" {
			t.Errorf("request %d: first chunk usage (-want +got):\n%s", i+1, d)
		}
		if len(first.Choices) != 1 || first.Choices[0].Delta.Role != "assistant" {
			t.Errorf("request %d: the first chunk is not the role chunk: %+v", i+1, first)
		}
	}
}

package server_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/metal/enginepool"
)

func openaiClient(a *testAgent, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(a.url + "/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
	}, opts...)...)
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestOpenAIClientChatAndCompletions drives the agent with the official OpenAI Go
// client: chat and text completions, streamed and not, by name and by alias.
func TestOpenAIClientChatAndCompletions(t *testing.T) {
	a := startAgent(t, agentOptions{})
	client := openaiClient(a)
	ctx := testContext(t)
	const maxTokens = 12

	for _, model := range []string{"tiny", "tiny-alias"} {
		t.Run("chat/"+model, func(t *testing.T) {
			resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:       model,
				Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello there")},
				MaxTokens:   openai.Int(maxTokens),
				Temperature: openai.Float(0),
			})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Model != model {
				t.Errorf("model = %q, want the name asked for, %q", resp.Model, model)
			}
			if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" || resp.Choices[0].FinishReason != "length" {
				t.Errorf("choices = %+v; want one non-empty choice finished by length", resp.Choices)
			}
			if resp.Usage.CompletionTokens != maxTokens || resp.Usage.PromptTokens == 0 ||
				resp.Usage.TotalTokens != resp.Usage.PromptTokens+maxTokens {
				t.Errorf("usage = %+v; want %d completion tokens and a consistent total", resp.Usage, maxTokens)
			}
		})

		t.Run("chat-stream/"+model, func(t *testing.T) {
			stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
				Model:         model,
				Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello there")},
				MaxTokens:     openai.Int(maxTokens),
				Temperature:   openai.Float(0),
				StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
			})
			var acc openai.ChatCompletionAccumulator
			chunks := 0
			for stream.Next() {
				c := stream.Current()
				acc.AddChunk(c)
				chunks++
				if c.Model != model {
					t.Errorf("chunk model = %q, want %q", c.Model, model)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if chunks < 3 {
				t.Errorf("%d chunks; want role, content and finish chunks", chunks)
			}
			if len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" || acc.Choices[0].FinishReason != "length" {
				t.Errorf("accumulated choices = %+v", acc.Choices)
			}
			if acc.Usage.CompletionTokens != maxTokens {
				t.Errorf("streamed usage = %+v; want %d completion tokens", acc.Usage, maxTokens)
			}
		})
	}

	t.Run("completion", func(t *testing.T) {
		resp, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:       "tiny",
			Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens:   openai.Int(maxTokens),
			Temperature: openai.Float(0),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Text == "" || resp.Usage.CompletionTokens != maxTokens {
			t.Errorf("completion = %+v, usage %+v", resp.Choices, resp.Usage)
		}
	})

	t.Run("completion-stream-token-prompt", func(t *testing.T) {
		stream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:         "tiny",
			Prompt:        openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 80, 81, 82}},
			MaxTokens:     openai.Int(maxTokens),
			Temperature:   openai.Float(0),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var text strings.Builder
		var usage openai.CompletionUsage
		for stream.Next() {
			c := stream.Current()
			for _, ch := range c.Choices {
				text.WriteString(ch.Text)
			}
			if c.Usage.CompletionTokens > 0 {
				usage = c.Usage
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if text.Len() == 0 || usage.CompletionTokens != maxTokens || usage.PromptTokens != 4 {
			t.Errorf("streamed text %q, usage %+v; want text, %d completion and 4 prompt tokens", text.String(), usage, maxTokens)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		a.expectMetric(6, "macfleet_agent_requests_total", "model", "tiny", "code", "200")
		a.expectMetric(3, "macfleet_agent_ttft_seconds", "model", "tiny")
		a.expectMetric(6*maxTokens, "macfleet_agent_generated_tokens_total", "model", "tiny")
		a.expectMetric(6, "macfleet_agent_tokens_per_second", "model", "tiny")
		a.expectMetric(1, enginepool.MetricLoads, "result", "ok")
		if n, _ := a.metric(enginepool.MetricMemoryCommitted); n <= 0 {
			t.Errorf("memory_committed_bytes = %v with a model loaded, want > 0", n)
		}
	})
}

// TestSSEFraming checks the raw event stream: one "data: {json}\n\n" per event, the
// usage chunk exactly when asked for, "data: [DONE]" last.
func TestSSEFraming(t *testing.T) {
	a := startAgent(t, agentOptions{})
	ctx := testContext(t)
	const maxTokens = 8

	type chunk struct {
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Delta struct {
				Role    string  `json:"role"`
				Content *string `json:"content"`
			} `json:"delta"`
			Text         string  `json:"text"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	tests := []struct {
		name, path string
		body       map[string]any
		usage      bool
	}{
		{name: "chat without usage", path: "/v1/chat/completions", body: chatBody("tiny", maxTokens, true)},
		{name: "chat with usage", path: "/v1/chat/completions", body: chatBody("tiny", maxTokens, true), usage: true},
		{name: "completion with usage", path: "/v1/completions", usage: true, body: map[string]any{
			"model": "tiny-alias", "prompt": "abc", "max_tokens": maxTokens, "temperature": 0, "stream": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.usage {
				tt.body["stream_options"] = map[string]any{"include_usage": true}
			}
			s := a.openStream(ctx, false, tt.path, tt.body)
			if cc := s.resp.Header.Get("Cache-Control"); cc != "no-cache" {
				t.Errorf("Cache-Control = %q, want no-cache", cc)
			}
			events := s.all()
			if len(events) == 0 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("events %q; want data: [DONE] last", events)
			}
			var finishes, usages, text int
			for i, ev := range events[:len(events)-1] {
				var c chunk
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					t.Fatalf("event %d %q: %v", i, ev, err)
				}
				if c.Model != tt.body["model"] {
					t.Errorf("event %d model %q, want %q", i, c.Model, tt.body["model"])
				}
				if c.Usage != nil {
					usages++
					if i != len(events)-2 || len(c.Choices) != 0 {
						t.Errorf("usage chunk %d %q is not the last before [DONE] with no choices", i, ev)
					}
					if c.Usage.CompletionTokens != maxTokens || c.Usage.PromptTokens == 0 {
						t.Errorf("usage %+v; want %d completion tokens", *c.Usage, maxTokens)
					}
				}
				for _, ch := range c.Choices {
					if ch.FinishReason != nil {
						finishes++
					}
					if ch.Text != "" || (ch.Delta.Content != nil && *ch.Delta.Content != "") {
						text++
					}
				}
			}
			wantUsages := 0
			if tt.usage {
				wantUsages = 1
			}
			if usages != wantUsages || finishes != 1 || text == 0 {
				t.Errorf("%d usage chunks (want %d), %d finish chunks (want 1), %d text chunks (want some)",
					usages, wantUsages, finishes, text)
			}
		})
	}
	// The usage the client did not ask for was still counted.
	a.expectMetric(3*maxTokens, "macfleet_agent_generated_tokens_total", "model", "tiny")
}

func TestEmbeddings(t *testing.T) {
	a := startAgent(t, agentOptions{})
	client := openaiClient(a)
	ctx := testContext(t)

	resp, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: "tiny-alias",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"first input", "second"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Model != "tiny-alias" || len(resp.Data) != 2 || resp.Usage.PromptTokens == 0 {
		t.Fatalf("embeddings: model %q, %d vectors, usage %+v", resp.Model, len(resp.Data), resp.Usage)
	}
	for i, d := range resp.Data {
		if d.Index != int64(i) || len(d.Embedding) != 128 {
			t.Errorf("vector %d: index %d, %d dimensions; want 128 (the model's embedding width)", i, d.Index, len(d.Embedding))
		}
	}
	if d := cmp.Diff(resp.Data[0].Embedding, resp.Data[1].Embedding); d == "" {
		t.Error("different inputs gave the same vector")
	}

	// base64 through raw HTTP, and token-id input.
	r, b := a.do(http.MethodPost, "/v1/embeddings", map[string]any{"model": "tiny", "input": [][]int{{1, 90, 91}},
		"encoding_format": "base64"})
	var out struct {
		Data []struct {
			Embedding string `json:"embedding"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &out); r.StatusCode != http.StatusOK || err != nil || len(out.Data) != 1 ||
		len(out.Data[0].Embedding) != base64.StdEncoding.EncodedLen(4*128) {
		t.Errorf("base64 embeddings: %d %s (%v)", r.StatusCode, b, err)
	}
}

func TestModelsEndpoints(t *testing.T) {
	a := startAgent(t, agentOptions{noRunner: true, specs: []enginepool.ModelSpec{
		tinySpec(t, config.Model{Name: "tiny", Aliases: []string{"t"}}),
		tinySpec(t, config.Model{Name: "other"}),
	}})
	client := openaiClient(a)
	ctx := testContext(t)

	page, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
		if m.OwnedBy != "macfleet" || m.Created == 0 {
			t.Errorf("model %+v: want owned_by macfleet and a creation time", m)
		}
	}
	if d := cmp.Diff([]string{"other", "tiny"}, ids); d != "" {
		t.Errorf("model ids (-want +got):\n%s", d)
	}
	m, err := client.Models.Get(ctx, "t")
	if err != nil || m.ID != "t" {
		t.Errorf("Get(alias) = %+v, %v", m, err)
	}
	_, err = client.Models.Get(ctx, "nope")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Errorf("Get(unknown) error = %v; want 404 model_not_found", err)
	}
	// Listing models loads nothing.
	if s := a.status(); s.Runners != 0 {
		t.Errorf("%d runners after listing models, want 0", s.Runners)
	}
}

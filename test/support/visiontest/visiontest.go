// Package visiontest asks image questions for tests: pictures made in Go, the chat
// request of a question about one with the official OpenAI client, and its greedy
// answer with the usage that shows the image's tokens and the prompt cache.
package visiontest

import (
	"bytes"
	"encoding/base64"
	"errors"
	"image"
	"image/color"
	"image/png"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// Question is what the tests ask about a picture.
const Question = "What is in this picture?"

// WriteModel writes a tiny Gemma 3 model to model and its synthesized projector to
// projector, and returns the projector.
func WriteModel(t testing.TB, model, projector string) ggufsynth.Projector {
	t.Helper()
	spec, err := ggufsynth.TinyFamily(ggufsynth.Gemma3)
	if err != nil {
		t.Fatal(err)
	}
	proj, err := ggufsynth.TinyProjector(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := ggufsynth.Write(model, spec); err != nil {
		t.Fatal(err)
	}
	if err := ggufsynth.WriteProjector(projector, proj); err != nil {
		t.Fatal(err)
	}
	return proj
}

// Answer is a greedy answer with its usage.
type Answer struct {
	Text string
	// Prompt counts the prompt's tokens (the image's among them), Cached those the
	// prompt cache served.
	Prompt, Cached int64
}

// ChatParams asks question about img (a URL or a data URI; none when empty, the
// image before the text), greedily, for at most maxTokens.
func ChatParams(model, question, img string, maxTokens int64) openai.ChatCompletionNewParams {
	parts := []openai.ChatCompletionContentPartUnionParam{openai.TextContentPart(question)}
	if img != "" {
		parts = append([]openai.ChatCompletionContentPartUnionParam{
			openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: img, Detail: "low"})}, parts...)
	}
	return openai.ChatCompletionNewParams{Model: model, Temperature: openai.Float(0), MaxTokens: openai.Int(maxTokens),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(parts)}}
}

// Ask sends ChatParams with c and returns the answer; a failed request or an empty
// answer fails t.
func Ask(t *testing.T, c openai.Client, params openai.ChatCompletionNewParams) Answer {
	t.Helper()
	resp, err := c.Chat.Completions.New(t.Context(), params)
	if err != nil {
		if apiErr := (*openai.Error)(nil); errors.As(err, &apiErr) {
			t.Fatalf("chat: %v: %s", err, apiErr.RawJSON())
		}
		t.Fatalf("chat: %v", err)
	}
	if len(resp.Choices) != 1 || resp.Usage.CompletionTokens == 0 {
		t.Fatalf("chat: %s", resp.RawJSON())
	}
	return Answer{Text: resp.Choices[0].Message.Content, Prompt: resp.Usage.PromptTokens,
		Cached: resp.Usage.PromptTokensDetails.CachedTokens}
}

// Gradient and Checkers are two pictures' pixels.
func Gradient(x, y int) color.RGBA { return color.RGBA{uint8(4 * x), uint8(4 * y), 128, 255} }

func Checkers(x, y int) color.RGBA {
	if (x/8+y/8)%2 == 0 {
		return color.RGBA{250, 250, 250, 255}
	}
	return color.RGBA{10, 60, 10, 255}
}

// Stripes is the n-th of as many further pictures as a test needs.
func Stripes(n int) func(x, y int) color.RGBA {
	return func(x, y int) color.RGBA {
		return color.RGBA{uint8((x*(n+1)*7 + y*5 + n*40) % 256), uint8(x * 4), uint8((y * 4) ^ (n * 60)), 255}
	}
}

// PNG is a 64×64 PNG of px.
func PNG(t testing.TB, px func(x, y int) color.RGBA) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 64, 64))
	for y := range 64 {
		for x := range 64 {
			img.SetRGBA(x, y, px(x, y))
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// DataURI is a PNG's data: URI.
func DataURI(png []byte) string {
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)
}

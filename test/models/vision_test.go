package models_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// visionQuestion is the text asked about an image.
const visionQuestion = "What is in this picture? Answer in one word."

// TestVision serves a tiny Gemma3 model with a synthesized projector: an image
// question is answered greedily with the image's tokens counted; the same image again
// is a cache hit (every prompt token but the last reused) answering as before; another
// image is a miss from the image on and answers as a cold runner does; a runner
// without a projector, and an image given by URL, are refused with the fix named; the
// default media marker in the text is text.
func TestVision(t *testing.T) {
	bin := os.Getenv(runnerproc.RunnerEnv)
	if bin == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	dir := t.TempDir()
	spec, err := ggufsynth.TinyFamily(ggufsynth.Gemma3)
	if err != nil {
		t.Fatal(err)
	}
	proj, err := ggufsynth.TinyProjector(spec)
	if err != nil {
		t.Fatal(err)
	}
	model, mmproj := filepath.Join(dir, "gemma3.gguf"), filepath.Join(dir, "gemma3-mmproj.gguf")
	if err := ggufsynth.Write(model, spec); err != nil {
		t.Fatal(err)
	}
	if err := ggufsynth.WriteProjector(mmproj, proj); err != nil {
		t.Fatal(err)
	}
	imgA, imgB := pngData(t, gradient), pngData(t, checkers)

	warm := startRunner(t, bin, model, "--mmproj", mmproj, "--parallel", "1", "--prompt-cache-hot-bytes", "67108864",
		"--prompt-cache-block", "16")
	if st := warm.status(); st.Chat == nil || !st.Chat.Vision {
		t.Fatalf("/status chat %+v: want vision reported", st.Chat)
	}
	w := visionClient(warm)
	text := w.ask(t, visionQuestion, "")
	first := w.ask(t, visionQuestion, imgA)
	if got := first.prompt - text.prompt; got < int64(proj.ImageTokens()) {
		t.Errorf("prompt tokens %d with the image, %d without: want at least the image's %d more", first.prompt, text.prompt, proj.ImageTokens())
	}
	again := w.ask(t, visionQuestion, imgA)
	if again.cached != again.prompt-1 || again.answer != first.answer {
		t.Errorf("the same image again: %d of %d prompt tokens cached, answer %q (first %q): want all but the last reused and the same answer",
			again.cached, again.prompt, again.answer, first.answer)
	}
	other := w.ask(t, visionQuestion, imgB)
	// Nothing from the image on may be reused (shared stand-in ids would reuse all
	// but the last token).
	if limit := other.prompt - int64(proj.ImageTokens()) - 1; other.cached > limit {
		t.Errorf("another image: %d of %d prompt tokens cached, want at most %d (the image is not the first one)", other.cached, other.prompt, limit)
	}

	// Image A again, its slot since taken by image B: restored from the prompt cache.
	if back := w.ask(t, visionQuestion, imgA); back.answer != first.answer || back.cached <= first.prompt-int64(proj.ImageTokens()) {
		t.Errorf("image A after image B: %d of %d prompt tokens cached, answer %q (first %q): want the image restored and the same answer",
			back.cached, back.prompt, back.answer, first.answer)
	}

	cold := visionClient(startRunner(t, bin, model, "--mmproj", mmproj))
	if c := cold.ask(t, visionQuestion, imgB); c.answer != other.answer || c.prompt != other.prompt {
		t.Errorf("image B on a cold runner: %q (%d prompt tokens), after image A: %q (%d)", c.answer, c.prompt, other.answer, other.prompt)
	}
	t.Logf("answers: text %q, image A %q, image B %q; prompt tokens %d / %d / %d", text.answer, first.answer, other.answer,
		text.prompt, first.prompt, other.prompt)

	// The default marker is text: a prompt with it and one image has one image.
	if m := w.ask(t, "<__media__> "+visionQuestion, imgA); m.prompt <= first.prompt {
		t.Errorf("a question holding <__media__>: %d prompt tokens, want more than the plain question's %d", m.prompt, first.prompt)
	}
	w.refused(t, "https://example.com/cat.png", "data URI")

	plain := visionClient(startRunner(t, bin, model))
	if st := plain.r.status(); st.Chat == nil || st.Chat.Vision {
		t.Fatalf("/status chat %+v without a projector: want no vision", st.Chat)
	}
	plain.refused(t, imgA, "spec.model.projector")
}

// visionRunner is a runner and the official client on it.
type visionRunner struct {
	r      *modelRunner
	client openai.Client
}

func visionClient(r *modelRunner) *visionRunner {
	return &visionRunner{r: r, client: openai.NewClient(option.WithBaseURL(r.base+"/v1/"), option.WithAPIKey("unused"),
		option.WithMaxRetries(0))}
}

// visionAnswer is a greedy answer with its usage.
type visionAnswer struct {
	answer         string
	prompt, cached int64
}

func visionParams(text, img string) openai.ChatCompletionNewParams {
	parts := []openai.ChatCompletionContentPartUnionParam{openai.TextContentPart(text)}
	if img != "" {
		parts = append([]openai.ChatCompletionContentPartUnionParam{
			openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: img, Detail: "low"})}, parts...)
	}
	return openai.ChatCompletionNewParams{Model: "test", Temperature: openai.Float(0), MaxTokens: openai.Int(answerTokens),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(parts)}}
}

// ask asks text about img (a data URI; none when empty).
func (v *visionRunner) ask(t *testing.T, text, img string) visionAnswer {
	t.Helper()
	c, err := v.client.Chat.Completions.New(t.Context(), visionParams(text, img))
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if len(c.Choices) != 1 || c.Usage.CompletionTokens == 0 {
		t.Fatalf("chat: %+v", c)
	}
	return visionAnswer{answer: c.Choices[0].Message.Content, prompt: c.Usage.PromptTokens,
		cached: c.Usage.PromptTokensDetails.CachedTokens}
}

// refused asks about img and checks the 400 names want.
func (v *visionRunner) refused(t *testing.T, img, want string) {
	t.Helper()
	_, err := v.client.Chat.Completions.New(t.Context(), visionParams(visionQuestion, img))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, want) {
		t.Fatalf("image %.40q: error %v, want a 400 naming %q", img, err, want)
	}
}

func gradient(x, y int) color.RGBA { return color.RGBA{uint8(4 * x), uint8(4 * y), 128, 255} }

func checkers(x, y int) color.RGBA {
	if (x/8+y/8)%2 == 0 {
		return color.RGBA{250, 250, 250, 255}
	}
	return color.RGBA{10, 60, 10, 255}
}

// pngData is a 64×64 PNG of px as a data URI.
func pngData(t *testing.T, px func(x, y int) color.RGBA) string {
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
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

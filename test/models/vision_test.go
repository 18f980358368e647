package models_test

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/visiontest"
)

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
	model, mmproj := filepath.Join(dir, "gemma3.gguf"), filepath.Join(dir, "gemma3-mmproj.gguf")
	proj := visiontest.WriteModel(t, model, mmproj)
	imgA := visiontest.DataURI(visiontest.PNG(t, visiontest.Gradient))
	imgB := visiontest.DataURI(visiontest.PNG(t, visiontest.Checkers))

	warm := startRunner(t, bin, model, "--mmproj", mmproj, "--parallel", "1", "--prompt-cache-hot-bytes", "67108864",
		"--prompt-cache-block", "16")
	if st := warm.status(); st.Chat == nil || !st.Chat.Vision {
		t.Fatalf("/status chat %+v: want vision reported", st.Chat)
	}
	w := visionClient(warm)
	text := w.ask(t, visiontest.Question, "")
	first := w.ask(t, visiontest.Question, imgA)
	if got := first.Prompt - text.Prompt; got < int64(proj.ImageTokens()) {
		t.Errorf("prompt tokens %d with the image, %d without: want at least the image's %d more", first.Prompt, text.Prompt, proj.ImageTokens())
	}
	again := w.ask(t, visiontest.Question, imgA)
	if again.Cached != again.Prompt-1 || again.Text != first.Text {
		t.Errorf("the same image again: %d of %d prompt tokens cached, answer %q (first %q): want all but the last reused and the same answer",
			again.Cached, again.Prompt, again.Text, first.Text)
	}
	other := w.ask(t, visiontest.Question, imgB)
	// Nothing from the image on may be reused (shared stand-in ids would reuse all
	// but the last token).
	if limit := other.Prompt - int64(proj.ImageTokens()) - 1; other.Cached > limit {
		t.Errorf("another image: %d of %d prompt tokens cached, want at most %d (the image is not the first one)", other.Cached, other.Prompt, limit)
	}

	// Image A again, its slot since taken by image B: restored from the prompt cache.
	if back := w.ask(t, visiontest.Question, imgA); back.Text != first.Text || back.Cached <= first.Prompt-int64(proj.ImageTokens()) {
		t.Errorf("image A after image B: %d of %d prompt tokens cached, answer %q (first %q): want the image restored and the same answer",
			back.Cached, back.Prompt, back.Text, first.Text)
	}

	cold := visionClient(startRunner(t, bin, model, "--mmproj", mmproj))
	if c := cold.ask(t, visiontest.Question, imgB); c.Text != other.Text || c.Prompt != other.Prompt {
		t.Errorf("image B on a cold runner: %q (%d prompt tokens), after image A: %q (%d)", c.Text, c.Prompt, other.Text, other.Prompt)
	}
	t.Logf("answers: text %q, image A %q, image B %q; prompt tokens %d / %d / %d", text.Text, first.Text, other.Text,
		text.Prompt, first.Prompt, other.Prompt)

	// The default marker is text: a prompt with it and one image has one image.
	if m := w.ask(t, "<__media__> "+visiontest.Question, imgA); m.Prompt <= first.Prompt {
		t.Errorf("a question holding <__media__>: %d prompt tokens, want more than the plain question's %d", m.Prompt, first.Prompt)
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

// ask asks text about img (a data URI; none when empty) greedily.
func (v *visionRunner) ask(t *testing.T, text, img string) visiontest.Answer {
	t.Helper()
	return visiontest.Ask(t, v.client, visiontest.ChatParams("test", text, img, answerTokens))
}

// refused asks about img and checks the 400 names want.
func (v *visionRunner) refused(t *testing.T, img, want string) {
	t.Helper()
	_, err := v.client.Chat.Completions.New(t.Context(), visiontest.ChatParams("test", visiontest.Question, img, answerTokens))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "invalid_value" ||
		!strings.Contains(apiErr.Message, want) {
		t.Fatalf("image %.40q: error %v, want a 400 invalid_value naming %q", img, err, want)
	}
}

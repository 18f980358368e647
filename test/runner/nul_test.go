package e2e

import (
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestNULBytes: a message holding a NUL byte is answered where the model's Jinja
// template renders it (the prompt is tokenized by its length); where the model has no
// Jinja template, llama.cpp's built-in templates take C strings, which would end the
// message at the NUL, so it is refused naming why.
func TestNULBytes(t *testing.T) {
	const body = `{"max_tokens":2,"messages":[{"role":"user","content":"a\u0000b"}]}`
	jinja := startReady(t, model(t, "tiny"), "--ctx", "256")
	var ok runnerapi.ChatCompletion
	if code := jinja.postJSON("/v1/chat/completions", body, &ok); code != 200 || len(ok.Choices) != 1 {
		t.Errorf("with a Jinja template: %d %+v, want the answer", code, ok)
	}
	// A template the Jinja engine cannot parse (a for without its end): the runner
	// falls back to llama.cpp's built-in ChatML, which the text names.
	builtin := startReady(t, specModel(t, "tiny-builtin-template", func() (ggufsynth.Spec, error) {
		s := ggufsynth.Tiny()
		s.ChatTemplate = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
		return s, nil
	}), "--ctx", "256")
	var eb runnerapi.ErrorBody
	code := builtin.postJSON("/v1/chat/completions", body, &eb)
	if code != 400 || eb.Error.Code != runnerapi.CodeInvalidValue || !strings.Contains(eb.Error.Message, "no Jinja chat template") {
		t.Errorf("with llama.cpp's built-in template: %d %+v, want 400 invalid_value naming the template", code, eb.Error)
	}
}

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// apiError is the OpenAI error body.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   string `json:"param"`
		Code    string `json:"code"`
	} `json:"error"`
}

// wantLimit400 posts body to the runner's chat endpoint and wants an OpenAI-shaped
// 400 on param whose message names limit; then the runner must still be up and
// answer an ordinary request.
func wantLimit400(t *testing.T, r *runner, body any, param, limit string) {
	t.Helper()
	var e apiError
	code := r.postJSON("/v1/chat/completions", body, &e)
	t.Logf("%d %+v", code, e.Error)
	if code != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || e.Error.Param != param ||
		!strings.Contains(e.Error.Message, limit) {
		t.Errorf("got %d %+v, want a 400 invalid_request_error on %s naming the %q", code, e.Error, param, limit)
	}
	select {
	case <-r.exited:
		t.Fatalf("the runner died (%v); stderr:\n%s", r.waitErr, r.stderr.String())
	default:
	}
	var ok map[string]any
	if code := r.postJSON("/v1/chat/completions", map[string]any{"model": "m", "max_tokens": 2,
		"messages": []map[string]any{{"role": "user", "content": "hi"}}}, &ok); code != http.StatusOK {
		t.Fatalf("an ordinary request after the bomb: %d %v", code, ok)
	}
}

// TestAttackChatTemplateBomb: a model whose chat template doubles a string, recurses
// through a macro, or repeats what a request sends as often as the request says,
// must get each such request a 400 naming the template limit it went over, and the
// runner must stay up to serve the next request. Before the limits the doubling
// built 128 MiB strings (a few more doublings exhaust the Mac), the macro recursed
// until the runner's stack overflowed and the process died, and the repetition built
// 256 MiB from a 1 MiB request.
func TestAttackChatTemplateBomb(t *testing.T) {
	const tmpl = `{% macro deep(n) %}{{ deep(n + 1) }}{% endmacro %}` +
		`{% if bomb == 'double' %}{% set ns = namespace(s='x') %}{% for i in range(27) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}` +
		`{% elif bomb == 'recurse' %}{{ deep(0) }}{% endif %}` +
		`{% for m in messages %}<|im_start|>{{ m.role }}` + "\n" + `{{ m.content * (repeat|default(1)) }}<|im_end|>` + "\n" + `{% endfor %}` +
		`{% if add_generation_prompt %}<|im_start|>assistant` + "\n" + `{% endif %}`
	spec := ggufsynth.Tiny()
	spec.ChatTemplate = tmpl
	r := startReady(t, specModel(t, "template-bomb", func() (ggufsynth.Spec, error) { return spec, nil }))

	req := func(content string, kwargs map[string]any) map[string]any {
		return map[string]any{"model": "m", "max_tokens": 2, "chat_template_kwargs": kwargs,
			"messages": []map[string]any{{"role": "user", "content": content}}}
	}
	t.Run("doubling", func(t *testing.T) {
		wantLimit400(t, r, req("hi", map[string]any{"bomb": "double"}), "messages", "string size limit")
	})
	t.Run("recursive macro", func(t *testing.T) {
		wantLimit400(t, r, req("hi", map[string]any{"bomb": "recurse"}), "messages", "call depth limit")
	})
	t.Run("repetition from the request", func(t *testing.T) {
		wantLimit400(t, r, req(strings.Repeat("y", 1<<20), map[string]any{"repeat": 256}), "messages", "string size limit")
	})
}

// TestAttackSchemaBomb: a response_format schema nested hundreds deep, with an enum
// of tens of thousands of values or a maxLength of a hundred thousand, must get a
// 400 on response_format naming the schema limit, before llama.cpp's converter
// recurses over it or writes a rule per repetition in the runner's process; the
// runner stays up.
func TestAttackSchemaBomb(t *testing.T) {
	r := startReady(t, model(t, "tiny"))
	format := func(schema string) map[string]any {
		return map[string]any{"model": "m", "max_tokens": 2,
			"messages":        []map[string]any{{"role": "user", "content": "hi"}},
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": json.RawMessage(schema)}}}
	}
	vals := make([]string, 30000)
	for i := range vals {
		vals[i] = fmt.Sprintf(`"v%d"`, i)
	}
	const param = "response_format.json_schema.schema"
	t.Run("deep nesting", func(t *testing.T) {
		deep := strings.Repeat(`{"type":"array","items":`, 200) + `{"type":"string"}` + strings.Repeat("}", 200)
		wantLimit400(t, r, format(deep), param, "schema depth limit")
	})
	t.Run("huge enum", func(t *testing.T) {
		wantLimit400(t, r, format(`{"enum":[`+strings.Join(vals, ",")+`]}`), param, "schema weight limit")
	})
	t.Run("long repetition", func(t *testing.T) {
		wantLimit400(t, r, format(`{"type":"string","maxLength":100000}`), param, "schema weight limit")
	})
}

package jinja

import (
	"errors"
	"testing"
)

// FuzzRender: any template either fails to parse with a *SyntaxError or renders
// to text within maxOutput (plus one value) or to an error, never a panic that
// escapes or a fatal stack overflow; a *LimitError names a limit the rendering
// really went over. Renderings get 20,000 steps and 20 M units of work instead of a
// million and MaxWork, so that each input takes milliseconds.
func FuzzRender(f *testing.F) {
	for _, src := range []string{
		`{% for m in messages %}<|im_start|>{{ m.role }}{{ m.content }}<|im_end|>{% endfor %}`,
		`{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}`,
		`{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`,
		`{{ ('ab' * 1000)|replace('a', 'xyz' * 1000)|length }}`,
		`{% set l = [] %}{% set _ = l.append(l) %}{{ l|tojson }}`,
		`{{ messages|map(attribute='content')|join(', ') }}{{ (messages|first).role|upper }}`,
		`{% set s = 'é' * 1000000 %}{% for i in range(100000) %}{{ s[i] }}{{ s[i:i+3] }}{{ s[::-7]|length }}{{ 'x' in s }}{% endfor %}`,
	} {
		f.Add(src)
	}
	vars := map[string]any{"messages": []any{
		map[string]any{"role": "user", "content": "hello"},
		map[string]any{"role": "assistant", "content": "hi"},
	}}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Parse(src)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("Parse: %T %v, want a *SyntaxError", err, err)
			}
			return
		}
		out, err := tmpl.render(vars, 20_000, 20_000_000)
		if err != nil {
			var le *LimitError
			if errors.As(err, &le) && le.Size <= le.Max {
				t.Fatalf("%v: the size is within the limit", le)
			}
			return
		}
		if len(out) > maxOutput+MaxValueBytes {
			t.Fatalf("rendered %d bytes", len(out))
		}
	})
}

package jinja

import (
	"errors"
	"runtime"
	"strings"
	"testing"
)

// Each bomb builds (or recurses) without bound in a few steps; the rendering must
// stop with a *LimitError naming the limit, having allocated a small multiple of
// MaxValueBytes at most.
func TestRenderBombsHitALimit(t *testing.T) {
	for _, tc := range []struct {
		name, src, limit string
		vars             map[string]any
	}{
		{"tilde doubling", `{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}`, "string size", nil},
		{"plus doubling", `{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}`, "string size", nil},
		{"repeat a long string", `{{ ('x' * 1000000) * 1000000 }}`, "string size", nil},
		{"repeat from the request", `{{ messages[0] * n }}`, "string size", map[string]any{"messages": []any{strings.Repeat("y", 1<<20)}, "n": 1 << 40}},
		{"list doubling", `{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}`, "list size", nil},
		{"join of shared strings", `{% set s = 'x' * 1000000 %}{{ [s]|list|join('') }}{% set l = range(100000)|map('string')|list %}{{ l|join(s) }}`, "", nil},
		{"many values under the limit", `{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = ns.l + [('x' * 16000000) ~ i] %}{% endfor %}`, "bytes built", nil},
		{"replace", `{{ ('a' * 1000000)|replace('a', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}`, "string size", nil},
		{"indent", `{{ 'a'|indent(100000000000, true) }}`, "string size", nil},
		{"format", `{{ '{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}'.format('x' * 1000000) }}`, "string size", nil},
		{"tojson of shared strings", `{% set s = 'x' * 1000000 %}{{ range(1000)|map('string')|list|map('replace', '0', s)|list|tojson }}`, "", nil},
		{"recursive macro", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, "call depth", nil},
		{"mutual recursion", `{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(0) }}`, "call depth", nil},
		{"self-containing list", `{% set l = [] %}{% set _ = l.append(l) %}{{ l }}`, "nesting depth", nil},
		{"self-containing equality", `{% set l = [] %}{% set _ = l.append(l) %}{{ l == l }}`, "nesting depth", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := Parse(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = tmpl.Render(tc.vars)
			runtime.ReadMemStats(&after)
			var le *LimitError
			if !errors.As(err, &le) || (tc.limit != "" && le.Limit != tc.limit) {
				t.Fatalf("Render: %v, want a LimitError on the %q limit", err, tc.limit)
			}
			if a := after.TotalAlloc - before.TotalAlloc; a > 4*MaxProducedBytes {
				t.Errorf("the bomb allocated %d MiB before it was stopped", a>>20)
			}
		})
	}
}

func TestParseRefusesDeepNesting(t *testing.T) {
	for name, src := range map[string]string{
		"parentheses": "{{ " + strings.Repeat("(", 100000) + "1" + strings.Repeat(")", 100000) + " }}",
		"negations":   "{{ " + strings.Repeat("-", 100000) + "1 }}",
		"nots":        "{{ " + strings.Repeat("not ", 100000) + "1 }}",
		"blocks":      strings.Repeat("{% if true %}", 100000) + strings.Repeat("{% endif %}", 100000),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(src)
			var se *SyntaxError
			if !errors.As(err, &se) || !strings.Contains(se.Msg, "nested deeper than") {
				t.Fatalf("Parse: %v, want a SyntaxError on the nesting", err)
			}
		})
	}
}

// A long chain of operators parses (it is a loop, not a recursion, in the parser)
// but evaluates by recursion: the evaluator's depth limit stops it.
func TestRenderStopsADeepExpression(t *testing.T) {
	tmpl, err := Parse("{{ 1" + strings.Repeat(" + 1", 100000) + " }}")
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.Render(nil)
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "nesting depth" {
		t.Fatalf("Render: %v, want a LimitError on the nesting depth", err)
	}
}

// The limits leave real templates alone: a long conversation renders whole.
func TestLimitsLeaveARealConversationAlone(t *testing.T) {
	tmpl, err := Parse(`{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []any
	for i := range 2000 {
		msgs = append(msgs, map[string]any{"role": "user", "content": strings.Repeat("word ", 200) + string(rune('a'+i%26))})
	}
	out, err := tmpl.Render(map[string]any{"messages": msgs})
	if err != nil || len(out) < 2000*1000 {
		t.Fatalf("Render: %d bytes, %v", len(out), err)
	}
}

package jinja

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/test/support/testassets"
)

// Each storm stays within the steps and the size limits and walks big values on
// every step: the work limit must stop it, in about a second of CPU (the bound
// asserted is generous, for the race detector). The bound is on the process's CPU
// time, not the wall clock: on a loaded machine the wall clock also counts other
// processes' turns, which is not work the template did.
func TestWorkBoundsEveryWalk(t *testing.T) {
	const big = `{% set a = 'x' * 30000000 %}{% set b = 'x' * 30000000 %}{% set u = 'é' * 16000000 %}{% set l = range(1000000)|list %}`
	for _, tc := range []struct{ name, src string }{
		{"substring search", `{% for i in range(900000) %}{% if 'y' in a %}{% endif %}{% endfor %}`},
		{"string method", `{% for i in range(900000) %}{% if a.endswith('y') or a.count('y') %}{% endif %}{% endfor %}`},
		{"string equality", `{% for i in range(900000) %}{% if a == b %}{% endif %}{% endfor %}`},
		{"string order", `{% for i in range(900000) %}{% if a < b %}{% endif %}{% endfor %}`},
		{"list equality", `{% for i in range(900000) %}{% if l == l %}{% endif %}{% endfor %}`},
		{"list membership", `{% for i in range(900000) %}{% if -1 in l %}{% endif %}{% endfor %}`},
		{"list index method", `{% for i in range(900000) %}{% if l.count(-1) %}{% endif %}{% endfor %}`},
		{"unique", `{{ l|unique|list|length }}`},
		{"sort shared long strings", `{% set m = [] %}{% for i in range(200000) %}{% set _ = m.append(a if i % 2 else b) %}{% endfor %}{{ m|sort|length }}`},
		{"map a filter over shared long strings", `{% set m = [] %}{% for i in range(400000) %}{% set _ = m.append(u) %}{% endfor %}{{ m|map('length')|list|length }}`},
		{"test with a long argument", `{% for i in range(900000) %}{% if a is equalto b %}{% endif %}{% endfor %}`},
		{"slice of a long string", `{% for i in range(900000) %}{% if u[::2] %}{% endif %}{% endfor %}`},
		{"length of more long strings than are indexed", `{% for i in range(900000) %}{{ u[i % 100:]|length }}{% endfor %}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := Parse(big + tc.src)
			if err != nil {
				t.Fatal(err)
			}
			cpu0, start := processCPU(t), time.Now()
			_, err = tmpl.Render(nil)
			took := processCPU(t) - cpu0
			t.Logf("%v of CPU (%v on the wall clock): %v", took, time.Since(start), err)
			var le *LimitError
			if !errors.As(err, &le) || le.Limit != "work" {
				t.Fatalf("Render: %v, want a LimitError on the work limit", err)
			}
			if took > 30*time.Second {
				t.Errorf("stopped after %v of CPU", took)
			}
		})
	}
}

// The work limit leaves real templates alone: each of the real chat templates
// renders a conversation that fills a long context (200 messages, 1 MiB, some of it
// non-ASCII) within a sixteenth of MaxWork.
func TestRealTemplatesWorkWithinASixteenth(t *testing.T) {
	all, err := testassets.ChatTemplates()
	if err != nil {
		t.Fatal(err)
	}
	var msgs []any
	roles := []string{"user", "assistant"}
	for i := range 200 {
		content := fmt.Sprintf("turn %d: ", i) + strings.Repeat("the fleet's memory, ĉiu Mac ✓ ", 180)
		msgs = append(msgs, map[string]any{"role": roles[i%2], "content": content})
	}
	vars := map[string]any{"messages": msgs, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"}
	rendered := 0
	for _, c := range all {
		tmpl, err := Parse(c.Source)
		if err != nil {
			continue
		}
		_, err = tmpl.render(vars, maxSteps, MaxWork/16)
		var le *LimitError
		if errors.As(err, &le) {
			t.Errorf("%s: %v", c.ID(), err)
		}
		if err == nil {
			rendered++
		}
	}
	if rendered < len(all)/2 {
		t.Fatalf("only %d of %d templates rendered the conversation", rendered, len(all))
	}
	t.Logf("%d of %d templates rendered within %d units of work", rendered, len(all), MaxWork/16)
}

// The rune index finds what []rune would, on ASCII, on mixed widths and on invalid
// bytes (each one U+FFFD), for every index and for slices of every step.
func TestStrIndexMatchesRunes(t *testing.T) {
	for name, s := range map[string]string{
		"ascii":   strings.Repeat("abcdefg", 50),
		"mixed":   strings.Repeat("aé✓😀", 250),
		"invalid": strings.Repeat("é\xff", 150) + "\xe2\x9c" + strings.Repeat("x", 100),
		"short":   "hé",
	} {
		t.Run(name, func(t *testing.T) {
			r := &renderer{b: &budget{maxWork: MaxWork}}
			x, err := r.runes(s)
			if err != nil {
				t.Fatal(err)
			}
			rs := []rune(s)
			if x.runes != len(rs) {
				t.Fatalf("%d runes, want %d", x.runes, len(rs))
			}
			for i := range rs {
				if got := x.at(i); got != string(rs[i]) {
					t.Fatalf("rune %d is %q, want %q", i, got, string(rs[i]))
				}
				if got, want := len([]rune(s[x.offset(i):])), len(rs)-i; got != want {
					t.Fatalf("offset of rune %d leaves %d runes, want %d", i, got, want)
				}
			}
			for _, step := range []int{2, 3, 63, 64, 70, -1, -2, -5, -64, -70} {
				for _, start := range []int{0, 1, len(rs) / 2, len(rs) - 1} {
					var want strings.Builder
					n := 0
					for i := start; i >= 0 && i < len(rs); i += step {
						want.WriteRune(rs[i])
						n++
					}
					if got := x.sliceString(slice{start: start, step: step, count: n}); got != want.String() {
						t.Fatalf("slice from %d by %d: %q, want %q", start, step, got, want.String())
					}
				}
			}
			if y, _ := r.runes(s); len(s) >= strIndexMin && y != x {
				t.Error("a long string was indexed twice")
			}
		})
	}
}

// processCPU is the CPU time (user and system) the test process has used so far.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

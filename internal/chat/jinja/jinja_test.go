package jinja

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/test/support/testassets"
)

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		vars      map[string]any
		parseErr  string
		renderErr string
		raised    string
	}{
		{name: "unclosed tag", src: "a\n{{ x", parseErr: "line 2: unclosed tag"},
		{name: "missing endif", src: "{% if x %}y", parseErr: "missing {% endif %}"},
		{name: "unknown tag", src: "\n\n{% frobnicate %}", parseErr: "line 3: unknown tag \"frobnicate\""},
		{name: "bad token", src: "{{ a $ b }}", parseErr: "unexpected character '$'"},
		{name: "raise", src: "{{ raise_exception('roles must alternate') }}", raised: "roles must alternate"},
		{name: "unknown filter", src: "\n{{ x | nosuch }}", vars: map[string]any{"x": 1}, renderErr: "line 2: filter nosuch: unknown filter"},
		{name: "call undefined", src: "{{ nosuch() }}", renderErr: "\"nosuch\" is undefined"},
		{name: "bad operands", src: "{{ 'a' - 1 }}", renderErr: "unsupported operand types for -: str and int"},
		{name: "set on non-namespace", src: "{% set x = 1 %}{% set x.y = 2 %}", renderErr: "only a namespace() can be assigned"},
		{name: "runaway loop", src: "{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", renderErr: "steps limit"},
		{name: "break outside loop", src: "{% break %}", renderErr: "break outside a loop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := Parse(tc.src)
			if tc.parseErr != "" {
				var se *SyntaxError
				if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.parseErr) {
					t.Fatalf("Parse error = %v, want a SyntaxError containing %q", err, tc.parseErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = tmpl.Render(tc.vars)
			if tc.raised != "" {
				var re *RaisedError
				if !errors.As(err, &re) || re.Message != tc.raised {
					t.Fatalf("Render error = %v, want RaisedError %q", err, tc.raised)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.renderErr) {
				t.Fatalf("Render error = %v, want one containing %q", err, tc.renderErr)
			}
		})
	}
}

func TestConcurrentRender(t *testing.T) {
	tmpl, err := Parse(`{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m }}{% endfor %}{{ ns.n }}`)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			msgs := []any{}
			for i := range g + 1 {
				msgs = append(msgs, fmt.Sprint(i))
			}
			want := strings.Join(strings.Split(fmt.Sprint(msgs...), " "), "") + fmt.Sprint(g+1)
			for range 200 {
				out, err := tmpl.Render(map[string]any{"messages": msgs})
				if err != nil || out != want {
					errs <- fmt.Errorf("got %q, %v; want %q", out, err, want)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkRenderLlama31Tools renders a 50-message conversation with tools and tool
// calls through the real Llama 3.1 template (target: under 1 ms).
func BenchmarkRenderLlama31Tools(b *testing.B) {
	src, err := testassets.Find("llama3-instruct", "tool_calls")
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := Parse(src.Source)
	if err != nil {
		b.Fatal(err)
	}
	vars := benchConversation(b, 50)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.Render(vars); err != nil {
			b.Fatal(err)
		}
	}
}

func benchConversation(b *testing.B, n int) map[string]any {
	var sb strings.Builder
	sb.WriteString(`{"add_generation_prompt":true,"bos_token":"<|begin_of_text|>","tools":[{"type":"function","function":{"name":"search","description":"Search the docs","parameters":{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer"}},"required":["query"]}}}],"messages":[{"role":"system","content":"You are a helpful assistant."}`)
	for i := 1; i < n; i++ {
		switch i % 4 {
		case 1:
			fmt.Fprintf(&sb, `,{"role":"user","content":"Question %d about the fleet: how much memory does the model on mac-%d use right now?"}`, i, i)
		case 2:
			fmt.Fprintf(&sb, `,{"role":"assistant","content":"","tool_calls":[{"id":"call_%d","type":"function","function":{"name":"search","arguments":{"query":"memory mac-%d","limit":3}}}]}`, i, i)
		case 3:
			fmt.Fprintf(&sb, `,{"role":"tool","tool_call_id":"call_%d","content":"{\"resident_bytes\": %d}"}`, i-1, i*1000000)
		default:
			fmt.Fprintf(&sb, `,{"role":"assistant","content":"The model on mac-%d holds about %d MB resident."}`, i, i)
		}
	}
	sb.WriteString(`]}`)
	v, err := FromJSON([]byte(sb.String()))
	if err != nil {
		b.Fatal(err)
	}
	vars := map[string]any{}
	d := v.(*Dict)
	for _, k := range d.Keys() {
		vars[k], _ = d.Get(k)
	}
	return vars
}

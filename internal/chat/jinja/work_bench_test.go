package jinja

import (
	"testing"

	"github.com/macfleet/macfleet/test/support/testassets"
)

// BenchmarkRenderRealTemplates renders the 50-message conversation of
// BenchmarkRenderLlama31Tools through every real chat template the module indexes,
// one after the other: the time per op is that of all of them, so that a change to
// the evaluator's accounting shows as a ratio against the code before it.
func BenchmarkRenderRealTemplates(b *testing.B) {
	all, err := testassets.ChatTemplates()
	if err != nil {
		b.Fatal(err)
	}
	var tmpls []*Template
	for _, c := range all {
		if t, err := Parse(c.Source); err == nil {
			tmpls = append(tmpls, t)
		}
	}
	vars := benchConversation(b, 50)
	vars["eos_token"] = "</s>"
	rendered := 0
	for _, t := range tmpls {
		if _, err := t.Render(vars); err == nil {
			rendered++
		}
	}
	if rendered < len(tmpls)/2 {
		b.Fatalf("only %d of %d templates rendered the conversation", rendered, len(tmpls))
	}
	b.ReportMetric(float64(rendered), "templates")
	b.ReportAllocs()
	for b.Loop() {
		for _, t := range tmpls {
			_, _ = t.Render(vars)
		}
	}
}

package chat

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestHarmonyStreams: the analysis and final channels' text is returned as it comes,
// holding back only what may be the start of an end mark; a call's message is held
// until it ends.
func TestHarmonyStreams(t *testing.T) {
	p := NewParser(Options{Format: FormatHarmony, Tools: true})
	steps := []struct {
		push string
		want Delta
	}{
		{"<|channel|>analy", Delta{}},
		{"sis<|message|>Need the", Delta{Reasoning: "Need the"}},
		{" time.<|e", Delta{Reasoning: " time."}},
		{"nd|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\"", Delta{}},
		{":\"UTC\"}<|call|>", Delta{}}, // the call: checked below without its id
		{"<|channel|>final<|message|>It is <|", Delta{Content: "It is "}},
		{"noon", Delta{Content: "<|noon"}},
	}
	for i, s := range steps {
		got := p.Push(s.push)
		if i == 4 {
			if len(got.ToolCalls) != 1 || got.ToolCalls[0].Function.Name != "get_time" || got.ToolCalls[0].Function.Arguments != `{"tz":"UTC"}` {
				t.Fatalf("push %q: %+v, want the call", s.push, got)
			}
			continue
		}
		if diff := cmp.Diff(s.want, got); diff != "" {
			t.Errorf("push %q (-want +got):\n%s", s.push, diff)
		}
	}
	if got := p.Finish(); !got.Empty() {
		t.Errorf("finish: %+v", got)
	}
}

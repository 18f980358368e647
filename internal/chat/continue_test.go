package chat

import (
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testassets"
)

func conversation(system bool, final ...runnerapi.Message) []runnerapi.Message {
	var msgs []runnerapi.Message
	if system {
		msgs = append(msgs, runnerapi.Message{Role: "system", Content: "Be brief."})
	}
	msgs = append(msgs, runnerapi.Message{Role: "user", Content: "Count to five."})
	return append(msgs, final...)
}

func assistant(text string) runnerapi.Message {
	return runnerapi.Message{Role: "assistant", Content: runnerapi.MessageContent(text)}
}

// TestRenderContinueRealTemplates renders partial answers open with real templates:
// the prompt ends with the answer's text where the model would have written it, after
// the template's own assistant header, and without its end of turn.
func TestRenderContinueRealTemplates(t *testing.T) {
	for _, tc := range []struct {
		family  string
		marks   []string
		system  bool
		partial string
		// wantTail is the end of the prompt: the assistant's header and the text.
		wantTail string
		wantErr  string
	}{
		{family: "chatml", system: true, partial: "One, two",
			wantTail: "Count to five.<|im_end|>\n<|im_start|>assistant\nOne, two"},
		{family: "llama3-instruct", marks: []string{"tool_calls"}, system: true, partial: "One,\ntwo",
			wantTail: "<|start_header_id|>assistant<|end_header_id|>\n\nOne,\ntwo"},
		{family: "gemma3-instruct", system: true, partial: "One, two",
			wantTail: "Count to five.<end_of_turn>\n<start_of_turn>model\nOne, two"},
		{family: "phi-3", partial: "One, two", wantTail: "<|end|>\n<|assistant|>\nOne, two"},
		{family: "command-r", partial: "One", wantTail: "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>One"},
		{family: "mistral-instruct", partial: "One, two", wantTail: "Count to five. [/INST]One, two"},
		// The empty answer: the prompt is the assistant's header alone.
		{family: "chatml", partial: "", wantTail: "<|im_start|>assistant\n"},
		// A template that trims the message still continues it, without the spaces.
		{family: "llama3-instruct", marks: []string{"tool_calls"}, partial: "  One",
			wantTail: "<|end_header_id|>\n\nOne"},
		// A template that refuses the conversation says so, as the generation does.
		{family: "gemma-instruct", system: true, partial: "One",
			wantErr: "cannot leave the assistant's message open: the model's chat template refused the conversation: System role not supported"},
	} {
		t.Run(tc.family+"/"+tc.partial, func(t *testing.T) {
			src, err := testassets.Find(tc.family, tc.marks...)
			if err != nil {
				t.Fatal(err)
			}
			tmpl, err := NewTemplate(src.Source, "<s>", "</s>")
			if err != nil {
				t.Fatal(err)
			}
			got, e := tmpl.RenderContinue(Input{Messages: conversation(tc.system, assistant(tc.partial))}, false)
			if tc.wantErr != "" {
				if e == nil || !strings.Contains(e.Message, tc.wantErr) || e.Code != runnerapi.CodeTemplateError {
					t.Fatalf("error %+v, want code %s and %q", e, runnerapi.CodeTemplateError, tc.wantErr)
				}
				return
			}
			if e != nil {
				t.Fatal(e.Message)
			}
			if !strings.HasSuffix(got.Prompt, tc.wantTail) {
				t.Errorf("prompt ends %q, want %q", tail(got.Prompt, len(tc.wantTail)+10), tc.wantTail)
			}
			if want := strings.TrimLeft(tc.partial, " "); got.Prompt[got.Open:] != want {
				t.Errorf("open text %q, want %q", got.Prompt[got.Open:], want)
			}
		})
	}
}

// TestRenderContinueEveryTemplate holds for every real template: it either continues
// the answer (the prompt is the closed rendering cut right after the answer's text) or
// says why it cannot.
func TestRenderContinueEveryTemplate(t *testing.T) {
	all, err := testassets.ChatTemplates()
	if err != nil {
		t.Fatal(err)
	}
	continued := 0
	for _, src := range all {
		tmpl, err := NewTemplate(src.Source, "<s>", "</s>")
		if err != nil {
			t.Errorf("%s: %v", src.ID(), err)
			continue
		}
		const partial = "One, two, th"
		msgs := conversation(false, assistant(partial))
		got, e := tmpl.RenderContinue(Input{Messages: msgs}, false)
		if e != nil {
			if e.Code != runnerapi.CodeTemplateError || !strings.Contains(e.Message, "cannot leave the assistant's message open") {
				t.Errorf("%s: error %+v does not say the template cannot continue", src.ID(), e)
			}
			continue
		}
		continued++
		closed, e := tmpl.Render(Input{Messages: msgs}, false)
		if e != nil {
			t.Errorf("%s: continues but does not render the closed conversation: %s", src.ID(), e.Message)
			continue
		}
		if !strings.HasPrefix(closed, got.Prompt) || got.Prompt[got.Open:] != partial || strings.Contains(got.Prompt, openMark) {
			t.Errorf("%s: open prompt %q is not the closed one %q cut after the answer", src.ID(), got.Prompt, closed)
		}
	}
	if continued < len(all)*3/4 {
		t.Errorf("%d of %d real templates continue an answer, want most", continued, len(all))
	}
}

// TestRenderContinueRefuses covers the conversations and templates that cannot be
// continued.
func TestRenderContinueRefuses(t *testing.T) {
	chatml, err := testassets.Find("chatml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, src string
		msgs      []runnerapi.Message
		wantCode  string
		want      string
	}{
		{name: "ends with the user", src: chatml.Source, msgs: conversation(false),
			wantCode: runnerapi.CodeInvalidValue, want: "end with the assistant's partial message"},
		{name: "tool calls", src: chatml.Source, wantCode: runnerapi.CodeUnsupportedParameter, want: "with tool calls",
			msgs: conversation(false, runnerapi.Message{Role: "assistant", ToolCalls: []runnerapi.ToolCall{{Function: runnerapi.FunctionCall{Name: "f", Arguments: "{}"}}}})},
		{name: "the mark in the conversation", src: chatml.Source, msgs: conversation(false, assistant("a "+openMark)),
			wantCode: runnerapi.CodeInvalidValue, want: "marks the open message"},
		{name: "drops the final message", wantCode: runnerapi.CodeTemplateError, want: "does not render the final assistant message's text once",
			src:  "{% for m in messages %}{% if m.role == 'user' %}U: {{ m.content }}\n{% endif %}{% endfor %}A:",
			msgs: conversation(false, assistant("One"))},
		{name: "rewrites the text", wantCode: runnerapi.CodeTemplateError, want: "rewrites the final assistant message's text",
			src:  "{% for m in messages %}{{ m.role }}: {{ m.content | replace('o', '0') }}\n{% endfor %}",
			msgs: conversation(false, assistant("one, two"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := NewTemplate(tc.src, "", "")
			if err != nil {
				t.Fatal(err)
			}
			_, e := tmpl.RenderContinue(Input{Messages: tc.msgs}, false)
			if e == nil || e.Code != tc.wantCode || !strings.Contains(e.Message, tc.want) {
				t.Fatalf("error %+v, want code %s and %q", e, tc.wantCode, tc.want)
			}
		})
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

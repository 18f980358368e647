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

// thinkingChatML renders each message's content as it is, and opens a <think> block
// in the generation prompt.
const thinkingChatML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
	"{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"

// thinkingDropped keeps only what follows a closed <think> block of an assistant
// message, as templates that drop past reasoning do.
const thinkingDropped = "{% for m in messages %}<|im_start|>{{ m.role }}\n" +
	"{% if m.role == 'assistant' and '</think>' in m.content %}{{ m.content.split('</think>')[-1] }}" +
	"{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}" +
	"{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"

// TestRenderContinueReasoning: an answer with reasoning_content is continued from its
// <think> block: inside it while it has no content (the output goes on as
// reasoning), after it once it has; the answer is counted from its <think>, and a
// template that knows no <think> blocks, or loses an open one, says it cannot.
func TestRenderContinueReasoning(t *testing.T) {
	chatml, err := testassets.Find("chatml")
	if err != nil {
		t.Fatal(err)
	}
	withThought := func(reasoning, content string) runnerapi.Message {
		m := assistant(content)
		m.ReasoningContent = reasoning
		return m
	}
	for _, tc := range []struct {
		name, src string
		msg       runnerapi.Message
		// wantTail ends the prompt; answer is Prompt[Open:], content Prompt[Content:].
		wantTail, answer, content string
		inReasoning               bool
		wantErr                   string
	}{
		{name: "inside the reasoning", src: thinkingChatML, msg: withThought("\nLet me see", ""),
			wantTail: "<|im_start|>assistant\n<think>\nLet me see", answer: "<think>\nLet me see", inReasoning: true},
		{name: "after the reasoning", src: thinkingChatML, msg: withThought("Hm.", "\n\nOne, two"),
			wantTail: "<|im_start|>assistant\n<think>Hm.</think>\n\nOne, two", answer: "<think>Hm.</think>\n\nOne, two", content: "\n\nOne, two"},
		{name: "a template that drops a closed block", src: thinkingDropped, msg: withThought("Hm.", "One, two"),
			wantTail: "<|im_start|>assistant\nOne, two", answer: "One, two", content: "One, two"},
		{name: "a template that drops a closed block, inside it", src: thinkingDropped, msg: withThought("Let me", ""),
			wantTail: "<|im_start|>assistant\n<think>Let me", answer: "<think>Let me", inReasoning: true},
		{name: "a template without <think> blocks", src: chatml.Source, msg: withThought("Let me", ""),
			wantErr: "it writes no <think> blocks"},
		{name: "a template that loses an open block", msg: withThought("Let me", ""),
			src:     "{% for m in messages %}{{ m.role }}: {{ m.content | replace('<think>', '') }}\n{% endfor %}{# <think> #}",
			wantErr: "does not render the reasoning of the final assistant message as an open <think> block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := NewTemplate(tc.src, "", "")
			if err != nil {
				t.Fatal(err)
			}
			got, e := tmpl.RenderContinue(Input{Messages: conversation(false, tc.msg)}, false)
			if tc.wantErr != "" {
				if e == nil || e.Code != runnerapi.CodeTemplateError || !strings.Contains(e.Message, tc.wantErr) {
					t.Fatalf("error %+v, want %q", e, tc.wantErr)
				}
				return
			}
			if e != nil {
				t.Fatal(e.Message)
			}
			if !strings.HasSuffix(got.Prompt, tc.wantTail) || got.Prompt[got.Open:] != tc.answer ||
				got.Prompt[got.Content:] != tc.content || got.InReasoning != tc.inReasoning {
				t.Errorf("prompt ends %q, answer %q, content %q, in reasoning %v; want %q, %q, %q, %v",
					tail(got.Prompt, len(tc.wantTail)+10), got.Prompt[got.Open:], got.Prompt[got.Content:], got.InReasoning,
					tc.wantTail, tc.answer, tc.content, tc.inReasoning)
			}
		})
	}
}

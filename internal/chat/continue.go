package chat

import (
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// openMark is put after the final assistant message's text when it is rendered open:
// where it lands in the rendered conversation is where the message's text ends. It is
// plain letters so that no filter a template applies to content (trim, escaping)
// changes it.
const openMark = "MACFLEETOPENMESSAGEENDSHERE"

// Continued is a conversation rendered with its final assistant message left open.
type Continued struct {
	// Prompt ends with the final message's text: no end-of-turn, no new turn.
	Prompt string
	// Open is where the final message's text starts in Prompt: Prompt[:Open] is the
	// conversation before it (what the runner counts as the prompt), Prompt[Open:] the
	// part of the answer already written (with reasoning, from its <think>).
	Open int
	// Content is where the answer's content starts in Prompt (Open without
	// reasoning): what an output grammar is advanced past is Prompt[Content:].
	Content int
	// InReasoning: the answer is open inside its reasoning (it has reasoning and no
	// content yet), so the output goes on as reasoning.
	InReasoning bool
}

// RenderContinue renders the conversation so that the model continues its final
// message, an assistant's partial answer, instead of starting a new turn. It renders
// the conversation without a generation prompt, the final message's text followed by
// a mark, and cuts the prompt where the mark lands. A template that does not render
// that text as it was written, right before the mark (it drops the message, rewrites
// its text, or refuses the conversation), cannot continue it: the error says so and
// why. A message with reasoning_content is written as the model wrote it, a <think>
// block and then the content (the block left open when there is no content yet), for
// a template that knows <think> blocks; the template may rewrite the block's
// whitespace, or drop a closed block from the message, but an open one must reach the
// prompt's end.
func (t *Template) RenderContinue(in Input, stripBOS bool) (Continued, *runnerapi.Error) {
	n := len(in.Messages)
	if n == 0 || in.Messages[n-1].Role != "assistant" {
		return Continued{}, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "messages",
			"continuing an answer needs the conversation to end with the assistant's partial message")
	}
	last := in.Messages[n-1]
	if len(last.ToolCalls) > 0 {
		return Continued{}, runnerapi.InvalidRequest(runnerapi.CodeUnsupportedParameter, "messages",
			"an assistant message with tool calls cannot be continued, only one with text")
	}
	for _, m := range in.Messages {
		if strings.Contains(string(m.Content), openMark) || strings.Contains(m.ReasoningContent, openMark) {
			return Continued{}, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "messages",
				"the conversation contains the text %s, which marks the open message", openMark)
		}
	}
	text, reasoning := string(last.Content), last.ReasoningContent
	raw := text
	if reasoning != "" {
		if !t.Thinking {
			return Continued{}, cannotContinue("it writes no <think> blocks, so an answer with reasoning_content cannot go on")
		}
		raw = thinkOpen + reasoning
		if text != "" {
			raw += thinkClose + text
		}
	}
	msgs := append([]runnerapi.Message(nil), in.Messages...)
	msgs[n-1].Content, msgs[n-1].ReasoningContent = runnerapi.MessageContent(raw+openMark), ""
	in.Messages, in.AddGenerationPrompt = msgs, false
	out, e := t.Render(in, stripBOS)
	if e != nil {
		e.Message = "the model's chat template cannot leave the assistant's message open: " + e.Message
		return Continued{}, e
	}
	at := strings.Index(out, openMark)
	if at < 0 || strings.Count(out, openMark) != 1 {
		return Continued{}, cannotContinue("it does not render the final assistant message's text once")
	}
	prompt := out[:at]
	// The text that must end the prompt: the content, or the open reasoning.
	tailText := text
	if reasoning != "" && text == "" {
		tailText = reasoning
	}
	// A template that trims the message's leading whitespace still continues it.
	written := tailText
	if !strings.HasSuffix(prompt, written) {
		written = strings.TrimLeft(tailText, " \t\r\n")
	}
	if !strings.HasSuffix(prompt, written) {
		return Continued{}, cannotContinue("it rewrites the final assistant message's text")
	}
	c := Continued{Prompt: prompt, Open: len(prompt) - len(written), Content: len(prompt) - len(written)}
	if reasoning == "" {
		return c, nil
	}
	// The answer starts at its <think>: the open block's, or a closed block's right
	// before the content (a template that dropped the block leaves the content alone).
	before := prompt[:c.Open]
	think, closed := strings.LastIndex(before, thinkOpen), strings.LastIndex(before, thinkClose)
	switch {
	case text == "" && (think < 0 || closed > think):
		return Continued{}, cannotContinue("it does not render the reasoning of the final assistant message as an open <think> block")
	case text == "":
		c.Open, c.Content, c.InReasoning = think, len(prompt), true
	case think >= 0 && closed > think && strings.TrimSpace(before[closed+len(thinkClose):]) == "":
		c.Open = think
	}
	return c, nil
}

func cannotContinue(why string) *runnerapi.Error {
	return runnerapi.InvalidRequest(runnerapi.CodeTemplateError, "messages",
		"the model's chat template cannot leave the assistant's message open: %s", why)
}

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
	// part of the answer already written.
	Open int
}

// RenderContinue renders the conversation so that the model continues its final
// message, an assistant's partial answer, instead of starting a new turn. It renders
// the conversation without a generation prompt, the final message's text followed by
// a mark, and cuts the prompt where the mark lands. A template that does not render
// that text as it was written, right before the mark (it drops the message, rewrites
// its text, or refuses the conversation), cannot continue it: the error says so and
// why.
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
	text := string(last.Content)
	for _, m := range in.Messages {
		if strings.Contains(string(m.Content), openMark) || strings.Contains(m.ReasoningContent, openMark) {
			return Continued{}, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "messages",
				"the conversation contains the text %s, which marks the open message", openMark)
		}
	}
	msgs := append([]runnerapi.Message(nil), in.Messages...)
	msgs[n-1].Content = runnerapi.MessageContent(text + openMark)
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
	// A template that trims the message's leading whitespace still continues it.
	written := text
	if !strings.HasSuffix(prompt, written) {
		written = strings.TrimLeft(text, " \t\r\n")
	}
	if !strings.HasSuffix(prompt, written) {
		return Continued{}, cannotContinue("it rewrites the final assistant message's text")
	}
	return Continued{Prompt: prompt, Open: len(prompt) - len(written)}, nil
}

func cannotContinue(why string) *runnerapi.Error {
	return runnerapi.InvalidRequest(runnerapi.CodeTemplateError, "messages",
		"the model's chat template cannot leave the assistant's message open: %s", why)
}

package corpus

import (
	"fmt"
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
)

// Conversation is one training document: a chat whose assistant messages are what
// the model learns to write, everything else the context it learns them in.
type Conversation struct {
	// Kind names the generator that wrote it (corpus.json counts documents per kind).
	Kind     string
	Tools    []runnerapi.Tool
	Messages []runnerapi.Message
}

// Document is a conversation as token ids: the rendered chat from its BOS to the
// end of its last assistant turn. Supervised[i] is set for the tokens the model
// writes (assistant turns, each with its end-of-turn token).
type Document struct {
	IDs        []int32
	Supervised []bool
}

// Tokens renders c with the chat template as the runner renders a request and
// tokenizes it as the runner tokenizes prompts. Each assistant turn is split off
// where the runner's prompt ends (the generation prompt) and tokenized on its own,
// as the model generates it; the template puts a special token or a line break
// before every turn, so the split never changes the tokens (TestSplitTokenization).
func (l *Llama3) Tokens(c Conversation) (Document, error) {
	var doc Document
	rendered := ""
	add := func(text string, supervised bool) error {
		ids, err := l.Encode(text)
		if err != nil {
			return fmt.Errorf("tokenizing %q: %w", clip(text), err)
		}
		doc.IDs = append(doc.IDs, ids...)
		for range ids {
			doc.Supervised = append(doc.Supervised, supervised)
		}
		return nil
	}
	for k, m := range c.Messages {
		if m.Role != "assistant" {
			continue
		}
		prompt, err := l.render(c, k, true)
		if err != nil {
			return doc, err
		}
		whole, err := l.render(c, k+1, false)
		if err != nil {
			return doc, err
		}
		if !strings.HasPrefix(prompt, rendered) || !strings.HasPrefix(whole, prompt) {
			return doc, fmt.Errorf("%s: the template does not render turn %d as a continuation of the turns before it", c.Kind, k)
		}
		if err := add(prompt[len(rendered):], false); err != nil {
			return doc, err
		}
		if err := add(whole[len(prompt):], true); err != nil {
			return doc, err
		}
		rendered = whole
	}
	if last := c.Messages[len(c.Messages)-1]; last.Role != "assistant" {
		return doc, fmt.Errorf("%s: the conversation ends with a %s message, not the assistant's", c.Kind, last.Role)
	}
	return doc, nil
}

// render renders the first n messages of c, opening the assistant's turn when gen.
func (l *Llama3) render(c Conversation, n int, gen bool) (string, error) {
	out, e := l.Template.Render(chat.Input{Messages: c.Messages[:n], Tools: c.Tools, AddGenerationPrompt: gen}, false)
	if e != nil {
		return "", fmt.Errorf("%s: rendering %d messages: %s", c.Kind, n, e.Message)
	}
	return out, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

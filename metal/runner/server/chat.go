//go:build cgo && !race

package server

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
	"github.com/macfleet/macfleet/internal/chat/grammar"
	"github.com/macfleet/macfleet/metal/runner/llama"
)

// chatRenderer renders chat requests for the loaded model and reads what its output
// parser needs: its own Jinja template when it has one that parses, else llama.cpp's
// built-in templates; and the control tokens whose text the output parser needs to
// see (tool-call and reasoning markers).
type chatRenderer struct {
	model   *llama.Model
	tmpl    string             // llama.cpp built-in template, when chat is nil
	chat    *chat.Template     // the model's own template (nil: none that parses)
	info    runnerapi.ChatInfo // reported in /status
	markers map[int32][]byte   // control tokens the output parser must see
	proj    *llama.Projector   // reads images (nil: none loaded, images are refused)
	log     logr.Logger
}

// newChatRenderer prepares chat rendering for the loaded model m.
func newChatRenderer(m *llama.Model, log logr.Logger) *chatRenderer {
	cr := &chatRenderer{model: m, markers: map[int32][]byte{}, log: log}
	src := m.ChatTemplate()
	cr.info = runnerapi.ChatInfo{Renderer: runnerapi.RendererBuiltin, ToolFormat: chat.FormatNone.String()}
	if src != "" {
		t, err := chat.NewTemplate(src, tokenText(m, m.BOS()), tokenText(m, m.EOS()))
		if err == nil {
			cr.chat = t
			cr.info = runnerapi.ChatInfo{Renderer: runnerapi.RendererJinja, ToolFormat: t.Format.String(), Tools: t.Tools, Thinking: t.Thinking}
		} else {
			cr.info.TemplateError = err.Error()
			log.Info("The model's chat template does not parse; using llama.cpp's built-in templates", "error", err.Error())
		}
	}
	if cr.chat == nil {
		cr.tmpl = pickTemplate(src, log)
	}
	var marks []string
	if cr.chat != nil {
		marks = append(cr.chat.Format.Markers(), "<think>", "</think>")
	}
	for _, mark := range marks {
		toks, err := m.Tokenize(mark, false, true)
		if err != nil || len(toks) != 1 || len(m.Piece(toks[0])) > 0 {
			continue // not a single control token: its text is in the output anyway
		}
		cr.markers[toks[0]] = []byte(mark)
	}
	return cr
}

// pickTemplate returns the template to format chats with: the model's own when
// llama.cpp recognises it, else chatml (the empty template).
func pickTemplate(t string, log logr.Logger) string {
	if t == "" {
		return ""
	}
	if _, err := llama.ApplyChatTemplate(t, []llama.ChatMessage{{Role: "user", Content: "hi"}}, true); err != nil {
		log.Info("The model's chat template is not supported; using chatml", "error", err.Error())
		return ""
	}
	return t
}

func tokenText(m *llama.Model, tok int32) string {
	if tok < 0 {
		return ""
	}
	return m.TokenText(tok)
}

// render renders a chat request into the prompt text (generation prompt added).
func (cr *chatRenderer) render(req *runnerapi.ChatRequest) (string, *runnerapi.Error) {
	if len(req.Messages) == 0 {
		return "", runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "messages", "messages must not be empty")
	}
	for i, m := range req.Messages {
		switch m.Role {
		case "system", "user", "assistant", "tool", "developer":
		default:
			return "", runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, fmt.Sprintf("messages[%d].role", i), "unsupported role %q", clipText(m.Role, 64))
		}
	}
	if cr.chat != nil {
		// The Jinja template renders Go strings and the prompt is tokenized by its
		// length: a NUL byte (the text of a byte-fallback token, which a broken
		// answer sent back to be continued may hold) is text like any other.
		return cr.chat.Render(chat.InputOf(req), cr.model.AddBOS())
	}
	for i, m := range req.Messages {
		// llama.cpp's built-in templates take C strings, which end at a NUL byte.
		if strings.IndexByte(string(m.Content), 0) >= 0 {
			return "", runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, fmt.Sprintf("messages[%d].content", i),
				"content must not contain NUL bytes with this model: it has no Jinja chat template, and llama.cpp's built-in templates end a message at its first NUL byte")
		}
	}
	if len(req.Tools) > 0 && (req.ToolChoice == nil || req.ToolChoice.Mode != "none") {
		return "", runnerapi.InvalidRequest(runnerapi.CodeUnsupportedParameter, "tools",
			"this model has no chat template that renders tools, so it cannot call them")
	}
	cm := make([]llama.ChatMessage, len(req.Messages))
	for i, m := range req.Messages {
		role := m.Role
		if role == "developer" {
			role = "system"
		}
		cm[i] = llama.ChatMessage{Role: role, Content: string(m.Content)}
	}
	prompt, err := llama.ApplyChatTemplate(cr.tmpl, cm, true)
	if err != nil {
		return "", runnerapi.Internal("applying the chat template: %v", err)
	}
	return prompt, nil
}

// renderRequest renders a chat request: as render does, or with its final
// assistant message left open when the header runnerapi.HeaderContinue asks to
// continue it (c.Open is where that message's answer starts in the prompt; -1: none).
func (cr *chatRenderer) renderRequest(req *runnerapi.ChatRequest, mode string) (c chat.Continued, herr *runnerapi.Error) {
	switch mode {
	case "":
		c.Prompt, herr = cr.render(req)
		c.Open = -1
		return c, herr
	case runnerapi.ContinueFinalMessage:
	default:
		return chat.Continued{}, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, runnerapi.HeaderContinue,
			"%s must be %q, got %q", runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage, clipText(mode, 64))
	}
	if _, herr = cr.render(req); herr != nil { // the same checks of the messages
		return chat.Continued{}, herr
	}
	if cr.chat == nil {
		return chat.Continued{}, runnerapi.InvalidRequest(runnerapi.CodeTemplateError, "messages",
			"this model has no Jinja chat template, so it cannot leave the assistant's message open")
	}
	return cr.chat.RenderContinue(chat.InputOf(req), cr.model.AddBOS())
}

// continuedAnswer is how a continued answer is read: as the tokens it was generated
// as (asGenerated: some of the gateway's ids were read), and the ids read whose text
// the client never got (held), which the output starts with.
type continuedAnswer struct {
	asGenerated bool
	held        []int32
}

// continued prepares the prompt tokens toks of request req that continues the answer
// open at prompt[open:] (runnerapi.HeaderContinue, with the headers h): the answer is
// read as the tokens the gateway says were generated, where they spell it
// (runnerapi.HeaderContinuedTokenIDs), and counted (continuedTokens).
func (cr *chatRenderer) continued(req *runnerapi.ChatRequest, prompt string, open int, images [][]byte, toks []int32,
	h http.Header, opts *runnerapi.Options) ([]int32, continuedAnswer, *runnerapi.Error) {
	if opts.N > 1 {
		return nil, continuedAnswer{}, runnerapi.InvalidRequest(runnerapi.CodeUnsupportedParameter, "n",
			"an answer is continued one choice at a time, got n=%d", opts.N)
	}
	// The images are in user messages, all before the open assistant message.
	head, _, herr := cr.promptTokens(prompt[:open], images)
	if herr != nil {
		return nil, continuedAnswer{}, herr
	}
	var ca continuedAnswer
	if ids := h.Get(runnerapi.HeaderContinuedTokenIDs); ids != "" && len(images) == 0 {
		content := string(req.Messages[len(req.Messages)-1].Content)
		toks, ca = cr.readAsGenerated(prompt, open, content, toks, head, ids)
	}
	return toks, ca, continuedTokens(len(head), len(toks), h.Get(runnerapi.HeaderContinuedTokens), opts)
}

// readAsGenerated is toks with the continued answer read as the gateway's token ids,
// header, for as far as they spell it (readAsGenerated), and how it was read; it logs
// when it did not read them all.
func (cr *chatRenderer) readAsGenerated(prompt string, open int, content string, toks, head []int32,
	header string) ([]int32, continuedAnswer) {
	ids, err := runnerapi.ParseTokenIDs(header)
	if err != nil {
		cr.log.Info("The gateway's token ids of a continued answer do not parse; reading the answer as its text tokenized",
			"error", err.Error())
		return toks, continuedAnswer{}
	}
	out, used, held := readAsGenerated(cr.model, prompt, open, content, toks, head, ids, cr.model.NVocab())
	if used < len(ids) {
		cr.log.Info("Continuing an answer with part of the gateway's token ids: the others do not spell its text, which is tokenized anew from there",
			"ids", len(ids), "used", used)
	} else {
		cr.log.V(2).Info("Continuing an answer as the tokens it was generated as", "ids", len(ids), "held", len(held))
	}
	return out, continuedAnswer{asGenerated: used > 0, held: held}
}

// continuedTokens counts the prompt's tokens after its first head (the continued
// answer's, of all tokens), which the usage does not report as prompt tokens. The
// answer counts as declared completion tokens (runnerapi.HeaderContinuedTokens: what
// the client was sent, as the gateway counted it), or as many as it is read as when
// none is declared; max_tokens bounds the whole answer, so what is left of it shrinks
// by them. An answer declared to have them all is spent (it ends at once, finish
// reason length); one that only is read as them (an estimate) still generates one
// token.
func continuedTokens(head, all int, declared string, opts *runnerapi.Options) *runnerapi.Error {
	opts.ContinuedPrompt = max(all-head, 0)
	opts.Continued = opts.ContinuedPrompt
	if declared != "" {
		n, err := strconv.Atoi(declared)
		if err != nil || n < 0 {
			return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, runnerapi.HeaderContinuedTokens,
				"%s must be a non-negative integer, got %q", runnerapi.HeaderContinuedTokens, clipText(declared, 64))
		}
		opts.Continued = n
	}
	if opts.MaxTokens > 0 {
		left := opts.MaxTokens - opts.Continued
		opts.MaxTokens, opts.Spent = max(left, 1), left <= 0 && declared != ""
	}
	return nil
}

// promptTokens tokenizes a rendered chat prompt (BOS added, special tokens parsed)
// with its images, if any (vision.go).
func (cr *chatRenderer) promptTokens(prompt string, images [][]byte) ([]int32, []promptImage, *runnerapi.Error) {
	if len(images) > 0 {
		return cr.imagePrompt(prompt, images)
	}
	toks, err := cr.model.Tokenize(prompt, true, true)
	if err != nil {
		return nil, nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "messages", "tokenizing: %v", err)
	}
	return toks, nil, nil
}

// options are the output parser's options for a request and its prompt.
func (cr *chatRenderer) options(req *runnerapi.ChatRequest, prompt string) chat.Options {
	o := chat.Options{Parallel: req.ParallelToolCalls == nil || *req.ParallelToolCalls}
	if cr.chat == nil {
		return o
	}
	o.Format = cr.chat.Format
	o.Tools = len(req.Tools) > 0 && (req.ToolChoice == nil || req.ToolChoice.Mode != "none")
	o.Defs = req.Tools
	o.Thinking = cr.chat.Thinking
	// A prompt that ends inside an open <think> block: the output starts with reasoning.
	trimmed := strings.TrimRight(prompt, " \t\r\n")
	o.InReasoning = o.Thinking && strings.HasSuffix(trimmed, "<think>")
	return o
}

func (g *generator) handleChat(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.ChatRequest
	eng, opts := g.readGeneration(w, r, &req)
	if eng == nil {
		return
	}
	marked, images, herr := g.m.chat.withImages(&req)
	if herr != nil {
		writeError(w, herr)
		return
	}
	rc, herr := g.m.chat.renderRequest(marked, r.Header.Get(runnerapi.HeaderContinue))
	if herr != nil {
		writeError(w, herr)
		return
	}
	prompt, open := rc.Prompt, rc.Open
	toks, ims, herr := g.m.chat.promptTokens(prompt, images)
	if herr != nil {
		writeError(w, herr)
		return
	}
	text := prompt
	var ca continuedAnswer
	if open >= 0 {
		if toks, ca, herr = g.m.chat.continued(&req, prompt, open, images, toks, r.Header, &opts); herr != nil {
			writeError(w, herr)
			return
		}
		if ca.asGenerated { // its tokens spell the model's bytes, not the prompt's text: not realigned to it
			text = ""
		}
	}
	co := g.m.chat.options(&req, prompt)
	if open >= 0 {
		// The grammar goes on past the content written; output that goes on inside
		// the answer's reasoning is parsed as reasoning.
		co.Continued, co.InReasoning = prompt[rc.Content:], co.InReasoning || rc.InReasoning
	}
	if opts.Grammar, opts.GrammarTriggers, herr = g.m.chat.grammar(&req, co); herr != nil {
		writeError(w, herr)
		return
	}
	g.generate(w, r, eng, &co, g.names.of(req.Model), text, toks, ims, opts, ca.held)
}

// grammar builds the grammar that response_format, tool_choice and strict tools
// put the output under, with the patterns that make it lazy (strict tools under
// "auto"), or "" when the output is free.
func (cr *chatRenderer) grammar(req *runnerapi.ChatRequest, co chat.Options) (string, []string, *runnerapi.Error) {
	spec, herr := grammar.ForChat(grammar.Input{Format: co.Format, Tools: req.Tools, ToolChoice: req.ToolChoice,
		Parallel: co.Parallel, ResponseFormat: req.ResponseFormat, InReasoning: co.InReasoning})
	if herr != nil || spec == nil {
		return "", nil, herr
	}
	if (req.Forced() || spec.Triggers != nil) && cr.chat == nil {
		return "", nil, runnerapi.InvalidRequest(runnerapi.CodeUnsupportedParameter, "tools",
			"this model has no chat template that renders tools, so it cannot call them")
	}
	schemas, rules := spec.JSON()
	g, err := llama.BuildGrammar(schemas, rules)
	if err == nil {
		err = grammar.CheckGrammarSize(g)
	}
	if err == nil {
		err = llama.CheckGrammar(cr.model, g, spec.Triggers, co.Continued)
	}
	if perr, ok := errors.AsType[*llama.PrefixError](err); ok {
		return "", nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "messages",
			"the assistant's message to continue (%s) does not follow the grammar of %s: %s",
			runnerapi.HeaderContinue, spec.Param, perr.Msg)
	}
	if err != nil {
		return "", nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, spec.Param, "the schema cannot be enforced: %v", err)
	}
	return g, spec.Triggers, nil
}

// clipText is s cut to at most n bytes (on a rune boundary) with "…" when cut: what
// an error message quotes of a client's value.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

package chat

import (
	"strings"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// The marks of gpt-oss's harmony format: its output is messages of the form
// [<|start|>assistant][ to=R]<|channel|>NAME[ to=R][ <|constrain|>json]<|message|>BODY
// ended by <|end|>, <|call|> or <|return|> (or the end of the output). The recipient
// R is written in the role part (before <|channel|>) or in the channel part (after
// the channel's name); the first message may begin at the recipient, the prompt
// having ended at <|start|>assistant.
const (
	harmonyStart     = "<|start|>assistant"
	harmonyChannel   = "<|channel|>"
	harmonyMessage   = "<|message|>"
	harmonyConstrain = "<|constrain|>"
	harmonyFunctions = "to=functions."
)

var harmonyEnds = []string{"<|end|>", "<|call|>", "<|return|>"}

// harmonyState is where a harmony parse is: before a message's body (its header not
// yet whole), or inside a body of a channel that streams (analysis, final) or of a
// call (held until it ends).
type harmonyState struct {
	buf    string
	inBody bool
	kind   harmonyKind
	name   string // the function a call message is addressed to
}

type harmonyKind int

const (
	harmonyContent harmonyKind = iota
	harmonyReasoning
	harmonyCall
)

// drainHarmony moves what it can of the harmony output buffered into d: message
// bodies of the analysis and final channels as they come (text that may be the start
// of an end mark held back), a call when its message ends. With final, the output
// has ended: what is left is read as it stands.
func (p *Parser) drainHarmony(d *Delta, final bool) {
	h := &p.harmony
	for h.buf != "" {
		if !h.inBody {
			if !p.harmonyHeader(d, final) {
				return
			}
			continue
		}
		end, mark := len(h.buf), ""
		for _, m := range harmonyEnds {
			if k := strings.Index(h.buf, m); k >= 0 && k < end {
				end, mark = k, m
			}
		}
		if mark == "" && !final {
			if h.kind != harmonyCall { // stream what cannot be an end mark's start
				hold := 0
				for _, m := range harmonyEnds {
					hold = max(hold, partialSuffix(h.buf, m))
				}
				p.harmonyText(d, h.buf[:len(h.buf)-hold])
				h.buf = h.buf[len(h.buf)-hold:]
			}
			return
		}
		msg := h.buf[:end]
		h.buf, h.inBody = h.buf[end+len(mark):], false
		if h.kind == harmonyCall {
			p.harmonyCall(d, msg, mark == "")
			continue
		}
		p.harmonyText(d, msg)
	}
}

// harmonyHeader reads a message's header from the buffer when it is whole, and
// reports whether it did (the body comes next). Text that is no header is content.
func (p *Parser) harmonyHeader(d *Delta, final bool) bool {
	h := &p.harmony
	text := h.buf
	for trimmed := ""; trimmed != text; { // the space, start and stray end marks between messages
		trimmed = text
		text = strings.TrimPrefix(strings.TrimLeft(text, " \t\r\n"), harmonyStart)
		for _, m := range harmonyEnds {
			text = strings.TrimPrefix(text, m)
		}
	}
	i := strings.Index(text, harmonyChannel)
	j := strings.Index(text, harmonyMessage)
	if i < 0 || j < i {
		if final {
			d.Content += text
			h.buf = ""
		}
		return false
	}
	channel, recipient := harmonyHeaderFields(text[:i], text[i+len(harmonyChannel):j])
	h.buf, h.inBody = text[j+len(harmonyMessage):], true
	h.kind = harmonyContent
	switch {
	case strings.HasPrefix(recipient, harmonyFunctions) && p.o.Tools:
		h.kind = harmonyCall
		h.name = strings.TrimPrefix(recipient, harmonyFunctions)
	case channel == "analysis":
		h.kind = harmonyReasoning
	}
	return true
}

// harmonyHeaderFields reads a message's header: the channel's name (the first word
// after <|channel|>) and the recipient ("to=functions.get_time"), which the channel
// part holds after the name or the role part before <|channel|> (the channel part's
// is taken when both hold one). A content type ("json", "<|constrain|>json") is no
// part of either. The caller reads a recipient other than to=functions.NAME (a
// built-in tool's, "to=browser.search") as no recipient: the message is its
// channel's text.
func harmonyHeaderFields(role, channelPart string) (channel, recipient string) {
	words := func(s string) []string { return strings.Fields(strings.ReplaceAll(s, harmonyConstrain, " ")) }
	to := func(ws []string) string {
		for _, w := range ws {
			if strings.HasPrefix(w, "to=") {
				return w
			}
		}
		return ""
	}
	ws := words(channelPart)
	if len(ws) > 0 {
		channel = ws[0]
		recipient = to(ws[1:])
	}
	if recipient == "" {
		recipient = to(words(role))
	}
	return channel, recipient
}

// harmonyText adds a streamed message's text to d as its channel's.
func (p *Parser) harmonyText(d *Delta, text string) {
	if p.harmony.kind == harmonyReasoning {
		d.Reasoning += text
		return
	}
	d.Content += text
}

// harmonyCall adds a call message's body to d: a call when its arguments are a JSON
// object and another call may be returned, else content (a call the end cut after
// complete ones is dropped, as in closeCall).
func (p *Parser) harmonyCall(d *Delta, msg string, cut bool) {
	args, ok := argumentString([]byte(msg))
	ok = ok && p.harmony.name != ""
	if !ok || (!p.o.Parallel && p.calls > 0) {
		if !ok && (!cut || p.calls == 0) {
			d.Content += msg
		}
		return
	}
	i := p.calls
	d.ToolCalls = append(d.ToolCalls, runnerapi.ToolCall{Index: &i, ID: NewCallID(), Type: "function",
		Function: runnerapi.FunctionCall{Name: p.harmony.name, Arguments: args}})
	p.calls++
}

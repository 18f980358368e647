package chat

import (
	"strings"

	"github.com/ollama/ollama/api"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// Delta is what a piece of model output adds to the answer.
type Delta struct {
	Content   string
	Reasoning string
	// ToolCalls are complete calls, Index set to their position in the answer.
	ToolCalls []runnerapi.ToolCall
}

// Empty reports a delta with nothing in it.
func (d Delta) Empty() bool { return d.Content == "" && d.Reasoning == "" && len(d.ToolCalls) == 0 }

// Options configure a Parser.
type Options struct {
	Format Format
	// Tools: the request offered tools, so calls are parsed out of the output.
	Tools bool
	// Parallel: more than one call may be returned (parallel_tool_calls).
	Parallel bool
	// Thinking: <think>…</think> at the start of the output is reasoning.
	Thinking bool
	// InReasoning: the prompt ended inside an open <think> block.
	InReasoning bool
	// Continued is the answer the output continues (runnerapi.HeaderContinue: the
	// open assistant message, as the prompt has it); the parser does not read it, the
	// runner advances the output's grammar past it.
	Continued string
	// Defs are the request's tools: their parameter schemas type the values of
	// formats that write them as text (Qwen3-Coder, GLM).
	Defs []runnerapi.Tool
}

type phase int

const (
	phaseStart phase = iota // nothing but whitespace seen yet
	phaseReasoning
	phaseContent
	phaseCall // inside a call region, buffered until it closes or the output ends
)

const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"
)

// Parser splits streamed model output into content, reasoning and tool calls. Text
// that may be the start of a marker is held back until it is decided, so no marker
// ever reaches the client; a malformed call is returned as content. Not safe for
// concurrent use.
type Parser struct {
	o     Options
	phase phase
	buf   string // undecided text
	call  string // text of the current call region
	calls int
	// thought: a reasoning block has closed; no second one opens.
	thought bool
	// harmony is the parse of harmony output (with tools offered or not: its
	// messages are channels, of which analysis is reasoning and final content).
	harmony harmonyState
	// tools are o.Defs as the module parsers take them, converted at the first call.
	tools     []api.Tool
	converted bool
}

// NewParser returns a parser for one answer.
func NewParser(o Options) *Parser {
	p := &Parser{o: o}
	if o.InReasoning {
		p.phase = phaseReasoning
	}
	return p
}

// Calls is the number of tool calls returned so far.
func (p *Parser) Calls() int { return p.calls }

// startMarker is the marker that opens a call region in the content phase.
func (p *Parser) startMarker() string {
	start, _ := p.o.Format.region()
	return start
}

// Push adds output text and returns what can be said of it now.
func (p *Parser) Push(text string) Delta {
	if p.o.Format == FormatHarmony {
		var d Delta
		p.harmony.buf += text
		p.drainHarmony(&d, false)
		return d
	}
	p.buf += text
	var d Delta
	p.drain(&d, false)
	return d
}

// Finish ends the output and returns the rest.
func (p *Parser) Finish() Delta {
	var d Delta
	if p.o.Format == FormatHarmony {
		p.drainHarmony(&d, true)
		return d
	}
	p.drain(&d, true)
	switch p.phase {
	case phaseReasoning:
		d.Reasoning += p.buf
	case phaseCall:
		p.closeCall(&d, p.call+p.buf, true)
	default:
		d.Content += p.buf
	}
	p.buf, p.call = "", ""
	return d
}

// drain moves what it can from the buffer into d, phase by phase; each phase's step
// reports whether the loop goes on (the phase changed) or must wait for more output.
func (p *Parser) drain(d *Delta, final bool) {
	for p.buf != "" {
		var more bool
		switch p.phase {
		case phaseStart:
			more = p.drainStart(d, final)
		case phaseReasoning:
			more = p.drainReasoning(d, final)
		case phaseContent:
			more = p.drainContent(d, final)
		case phaseCall:
			more = p.drainCall(d)
		}
		if !more {
			return
		}
	}
}

// drainStart skips the leading blank, then decides what the output opens with: a
// reasoning block, a Llama 3 call region or content.
func (p *Parser) drainStart(d *Delta, final bool) bool {
	trimmed := strings.TrimLeft(p.buf, " \t\r\n")
	if trimmed == "" {
		if final {
			d.Content += p.buf
			p.buf = ""
		}
		return false
	}
	if p.o.Thinking && !p.thought {
		if strings.HasPrefix(trimmed, thinkOpen) {
			p.buf = trimmed[len(thinkOpen):]
			p.phase = phaseReasoning
			return true
		}
		if !final && strings.HasPrefix(thinkOpen, trimmed) {
			return false // maybe <think>
		}
	}
	if p.o.Tools && p.o.Format == FormatLlama3 && strings.HasPrefix(trimmed, "{") {
		// A Llama 3 answer that opens with a JSON object is a call region to
		// the end of the output.
		p.buf = trimmed
		p.phase = phaseCall
		return true
	}
	if p.thought {
		p.buf = trimmed // the blank lines after </think>
	}
	p.phase = phaseContent
	return true
}

// drainReasoning moves reasoning into d up to </think>, which returns to the start.
func (p *Parser) drainReasoning(d *Delta, final bool) bool {
	i := strings.Index(p.buf, thinkClose)
	if i < 0 {
		p.emitUpTo(&d.Reasoning, thinkClose, final)
		return false
	}
	d.Reasoning += p.buf[:i]
	p.buf = p.buf[i+len(thinkClose):]
	p.phase, p.thought = phaseStart, true
	return true
}

// drainContent moves content into d up to the start of a call region, when calls are
// expected and another is allowed.
func (p *Parser) drainContent(d *Delta, final bool) bool {
	marker := ""
	if p.o.Tools && (p.o.Parallel || p.calls == 0) {
		marker = p.startMarker()
	}
	if marker == "" {
		d.Content += p.buf
		p.buf = ""
		return false
	}
	i := strings.Index(p.buf, marker)
	if i < 0 {
		p.emitUpTo(&d.Content, marker, final)
		return false
	}
	d.Content += p.buf[:i]
	p.buf = p.buf[i:]
	p.phase = phaseCall
	return true
}

// drainCall buffers a call region until its end marker, then closes the call; regions
// without an end marker run to the end of the output.
func (p *Parser) drainCall(d *Delta) bool {
	_, end := p.o.Format.region()
	if end == "" {
		// Llama 3 and Mistral calls run to the end of the output.
		p.call += p.buf
		p.buf = ""
		return false
	}
	p.call += p.buf
	p.buf = ""
	i := strings.Index(p.call, end)
	if i < 0 {
		return false
	}
	region := p.call[:i+len(end)]
	p.buf, p.call = p.call[i+len(end):], ""
	p.closeCall(d, region, false)
	return true
}

// emitUpTo appends the whole buffer to *dst, keeping back a tail that may be the start
// of marker unless the output has ended.
func (p *Parser) emitUpTo(dst *string, marker string, final bool) {
	keep := 0
	if !final {
		keep = partialSuffix(p.buf, marker)
	}
	*dst += p.buf[:len(p.buf)-keep]
	p.buf = p.buf[len(p.buf)-keep:]
}

// closeCall parses a finished call region into calls, or returns it as content.
// atEnd: the output ended inside the region, so its last call may be cut short (by
// max_tokens); the complete calls before it are returned and the cut one is dropped
// when the answer has a complete call, the finish reason telling the client that the
// limit cut what followed. A region whose only call is cut stays content.
func (p *Parser) closeCall(d *Delta, region string, atEnd bool) {
	text := region
	if start, end := p.o.Format.region(); end != "" {
		text = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(region), start), end)
	}
	if !p.converted {
		p.tools, p.converted = moduleTools(p.o.Defs), true
	}
	calls, cut := parseCalls(p.o.Format, text, atEnd, p.tools)
	if len(calls) == 0 && (!cut || p.calls == 0) {
		d.Content += region
		p.phase = phaseContent
		return
	}
	for _, c := range calls {
		if !p.o.Parallel && p.calls > 0 {
			break
		}
		i := p.calls
		c.Index = &i
		d.ToolCalls = append(d.ToolCalls, c)
		p.calls++
	}
	p.phase = phaseContent
}

// partialSuffix is the length of the longest suffix of s that is a proper prefix of
// marker: text that may still become the marker.
func partialSuffix(s, marker string) int {
	for n := min(len(s), len(marker)-1); n > 0; n-- {
		if strings.HasSuffix(s, marker[:n]) {
			return n
		}
	}
	return 0
}

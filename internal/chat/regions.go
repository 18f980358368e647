package chat

import (
	"encoding/json"
	"strings"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/model/parsers"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// The special marks of the formats that wrap their calls in a region of their own.
const (
	deepseekCallsBegin = "<｜tool▁calls▁begin｜>"
	deepseekCallsEnd   = "<｜tool▁calls▁end｜>"
	deepseekCallBegin  = "<｜tool▁call▁begin｜>"
	deepseekCallEnd    = "<｜tool▁call▁end｜>"
	deepseekSep        = "<｜tool▁sep｜>"

	kimiSectionBegin = "<|tool_calls_section_begin|>"
	kimiSectionEnd   = "<|tool_calls_section_end|>"
	kimiCallBegin    = "<|tool_call_begin|>"
	kimiArgBegin     = "<|tool_call_argument_begin|>"
	kimiCallEnd      = "<|tool_call_end|>"

	gemmaCallBegin = "<start_function_call>"
	gemmaCallEnd   = "<end_function_call>"

	toolCallOpen  = "<tool_call>"
	toolCallClose = "</tool_call>"
)

// region is where format f writes its calls: from start to end, or to the end of the
// output when end is "". Harmony has none (its output is parsed whole).
func (f Format) region() (start, end string) {
	switch f {
	case FormatHermes, FormatNone, FormatQwen3Coder, FormatGLM:
		return toolCallOpen, toolCallClose
	case FormatMistral:
		return "[TOOL_CALLS]", ""
	case FormatLlama3:
		return "<|python_tag|>", ""
	case FormatDeepSeek:
		return deepseekCallsBegin, deepseekCallsEnd
	case FormatKimi:
		return kimiSectionBegin, kimiSectionEnd
	case FormatFunctionGemma:
		return gemmaCallBegin, gemmaCallEnd
	}
	return "", ""
}

// rawCall is a call's name and its arguments as a compact JSON object.
type rawCall struct{ name, args string }

// regionDecoder parses the text inside a region (marks stripped) into calls. It
// returns no calls and cut false when the text is not calls, so it stays content;
// with atEnd (the output ended inside the region) a last call the end cut short is
// left out and cut is true.
type regionDecoder func(text string, atEnd bool, tools []api.Tool) (calls []rawCall, cut bool)

// decoderFor is the decoder of a region's text in format f, or nil where the
// region holds JSON call objects (parseCalls' own syntax). A <tool_call> region is
// read by what it holds, so a template detected as one of the formats that share
// the tag still has its calls parsed.
func decoderFor(f Format, text string) regionDecoder {
	switch f {
	case FormatDeepSeek:
		return decodeDeepSeek
	case FormatKimi:
		return decodeKimi
	case FormatFunctionGemma:
		return decodeFunctionGemma
	case FormatHermes, FormatNone, FormatQwen3Coder, FormatGLM:
		switch {
		case strings.HasPrefix(text, "{"):
			return nil
		case strings.HasPrefix(text, "<function="):
			return decodeQwen3Coder
		case f == FormatGLM || strings.Contains(text, "<arg_key>"):
			return decodeGLM
		}
	}
	return nil
}

// decodeQwen3Coder reads <function=NAME><parameter=KEY>VALUE</parameter></function>,
// each value typed by the tool's schema, with the module parser of that format.
func decodeQwen3Coder(text string, atEnd bool, tools []api.Tool) ([]rawCall, bool) {
	if atEnd && !strings.Contains(text, "</function>") {
		return nil, true
	}
	return moduleCall(&parsers.Qwen3CoderParser{}, tools, text)
}

// decodeGLM reads NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>…, values
// typed by the tool's schema, with the module parser of that format.
func decodeGLM(text string, atEnd bool, tools []api.Tool) ([]rawCall, bool) {
	if atEnd {
		return nil, true // the end may have cut a value: no way to tell
	}
	name, _, _ := strings.Cut(text, "<arg_key>")
	if name = strings.TrimSpace(name); name == "" || strings.ContainsAny(name, " \t\r\n<>{}") {
		return nil, false
	}
	return moduleCall(&parsers.GLM46Parser{}, tools, text)
}

// decodeFunctionGemma reads call:NAME{KEY:VALUE,…} with the module parser of that
// format.
func decodeFunctionGemma(text string, atEnd bool, tools []api.Tool) ([]rawCall, bool) {
	if atEnd {
		return nil, true
	}
	if !strings.HasPrefix(text, "call:") || !strings.HasSuffix(text, "}") {
		return nil, false
	}
	return moduleCallWith(&parsers.FunctionGemmaParser{}, tools, gemmaCallBegin+text+gemmaCallEnd)
}

// moduleCall decodes one <tool_call> region's text with a module parser.
func moduleCall(p parsers.Parser, tools []api.Tool, text string) ([]rawCall, bool) {
	return moduleCallWith(p, tools, toolCallOpen+text+toolCallClose)
}

// moduleCallWith feeds a whole region to a fresh module parser: it is a call when the
// parser returns exactly one and nothing else (parseCalls checks its name). The region is model output: a
// parser that panics on it (the function-calling Gemma parser slices out of range on a
// lone <escape> value) makes the region content, not a failed request.
func moduleCallWith(p parsers.Parser, tools []api.Tool, region string) (calls []rawCall, cut bool) {
	defer func() {
		if recover() != nil {
			calls, cut = nil, false
		}
	}()
	p.Init(tools, nil, nil)
	content, thinking, found, err := p.Add(region, true)
	if err != nil || len(found) != 1 || strings.TrimSpace(content+thinking) != "" {
		return nil, false
	}
	b, err := json.Marshal(found[0].Function.Arguments)
	if err != nil {
		return nil, false
	}
	args, ok := argumentString(b)
	if !ok {
		return nil, false
	}
	return []rawCall{{found[0].Function.Name, args}}, false
}

// decodeDeepSeek reads <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>, repeated.
func decodeDeepSeek(text string, atEnd bool, _ []api.Tool) ([]rawCall, bool) {
	return decodeDelimited(text, atEnd, deepseekCallBegin, deepseekSep, deepseekCallEnd, strings.TrimSpace)
}

// decodeKimi reads <|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{…}
// <|tool_call_end|>, repeated.
func decodeKimi(text string, atEnd bool, _ []api.Tool) ([]rawCall, bool) {
	return decodeDelimited(text, atEnd, kimiCallBegin, kimiArgBegin, kimiCallEnd, func(head string) string {
		head = strings.TrimPrefix(strings.TrimSpace(head), "functions.")
		if i := strings.LastIndexByte(head, ':'); i >= 0 {
			head = head[:i]
		}
		return head
	})
}

// decodeDelimited reads calls written as begin HEAD sep ARGS end, whitespace between
// them; name takes the function's name out of HEAD.
func decodeDelimited(text string, atEnd bool, begin, sep, end string, name func(string) string) ([]rawCall, bool) {
	var out []rawCall
	for text = strings.TrimSpace(text); text != ""; text = strings.TrimSpace(text) {
		if !strings.HasPrefix(text, begin) {
			// The end may cut the begin mark itself.
			return ifCutRaw(out, atEnd && strings.HasPrefix(begin, text))
		}
		body, rest, closed := strings.Cut(text[len(begin):], end)
		head, args, hasSep := strings.Cut(body, sep)
		if !closed {
			return ifCutRaw(out, atEnd)
		}
		n := name(head)
		a, ok := argumentString(json.RawMessage(args))
		if !hasSep || n == "" || !ok {
			return nil, false
		}
		out = append(out, rawCall{n, a})
		text = rest
	}
	if len(out) == 0 {
		return nil, atEnd
	}
	return out, false
}

// ifCutRaw is ifCut for decoders.
func ifCutRaw(complete []rawCall, cut bool) ([]rawCall, bool) {
	if !cut {
		return nil, false
	}
	return complete, true
}

// moduleTools are the request's tools as the module parsers take them (for the
// parameter types of formats that write values as text). Tools whose schema they
// cannot read are left out: those calls' values stay strings.
func moduleTools(tools []runnerapi.Tool) []api.Tool {
	var out []api.Tool
	for _, t := range tools {
		b, err := json.Marshal(t)
		if err != nil {
			continue
		}
		var m api.Tool
		if json.Unmarshal(b, &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// Package jinja renders the Jinja chat templates that GGUF models carry in
// tokenizer.chat_template. It implements the part of Jinja that chat templates use, with
// the settings transformers renders them with (trim_blocks, lstrip_blocks, loop controls,
// no autoescape) and Python's semantics for values: dicts keep their key order, so tojson
// prints a tool's JSON schema in the order the client sent it.
//
// A template is parsed once (Parse) and rendered many times (Template.Render), safely
// from several goroutines. Errors carry the template line; an error raised by the
// template itself (raise_exception) is a *RaisedError so callers can report it as the
// client's mistake.
package jinja

import (
	"fmt"
	"strings"
)

// tokKind classifies lexer tokens.
type tokKind int

const (
	tText tokKind = iota
	tVarBegin
	tVarEnd
	tBlockBegin
	tBlockEnd
	tName
	tString
	tInt
	tFloat
	tOp
	tEOF
)

type token struct {
	kind tokKind
	val  string
	line int
}

func (t token) String() string {
	switch t.kind {
	case tEOF:
		return "end of template"
	case tText:
		return "text"
	case tString:
		return fmt.Sprintf("string %q", t.val)
	}
	return fmt.Sprintf("%q", t.val)
}

// SyntaxError is a template that does not parse.
type SyntaxError struct {
	Line int
	Msg  string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("template syntax error at line %d: %s", e.Line, e.Msg)
}

// lex splits src into tokens, applying whitespace control: "-" markers strip the
// whitespace beside a tag; block and comment tags also strip the newline after them
// (trim_blocks) and the indentation before them on their line (lstrip_blocks, unless
// the tag opens with "+").
func lex(src string) ([]token, error) {
	l := &lexer{src: src, line: 1}
	for l.pos < len(src) {
		next := nextTag(src, l.pos)
		if next < 0 {
			l.text(l.leading(src[l.pos:]))
			break
		}
		if err := l.tag(next); err != nil {
			return nil, err
		}
		if l.openedRaw() {
			if err := l.raw(); err != nil {
				return nil, err
			}
		}
	}
	l.toks = append(l.toks, token{kind: tEOF, line: l.line})
	return l.toks, nil
}

// lexer is lex's state between tags.
type lexer struct {
	src  string
	toks []token
	line int
	pos  int
	// stripAll: the previous tag ended with "-" (strip all leading whitespace of the
	// next text); stripNL: it was a block (strip one leading newline).
	stripAll, stripNL bool
}

// leading is text after the previous tag with that tag's whitespace control applied.
func (l *lexer) leading(text string) string {
	if l.stripAll {
		text = strings.TrimLeft(text, " \t\r\n")
	} else if l.stripNL {
		if strings.HasPrefix(text, "\r\n") {
			text = text[2:]
		} else if strings.HasPrefix(text, "\n") {
			text = text[1:]
		}
	}
	l.stripAll, l.stripNL = false, false
	return text
}

// text appends a text token unless text is empty.
func (l *lexer) text(text string) {
	if text != "" {
		l.toks = append(l.toks, token{kind: tText, val: text, line: l.line})
	}
}

// tag lexes the text before the tag at next and the tag itself.
func (l *lexer) tag(next int) error {
	src := l.src
	text := l.leading(src[l.pos:next])
	open := src[next : next+2]
	marker := byte(0)
	if next+2 < len(src) {
		marker = src[next+2]
	}
	switch {
	case marker == '-':
		text = strings.TrimRight(text, " \t\r\n")
	case open != "{{" && marker != '+':
		// lstrip_blocks: drop spaces and tabs between the line start and the tag.
		tail := text[strings.LastIndexByte(text, '\n')+1:]
		if strings.Trim(tail, " \t") == "" && atLineStart(src, next-len(tail)) {
			text = text[:len(text)-len(tail)]
		}
	}
	l.text(text)
	l.line += strings.Count(src[l.pos:next], "\n")
	l.pos = next + 2
	if marker == '-' || marker == '+' {
		l.pos++
	}
	if open == "{#" {
		return l.comment()
	}
	return l.expr(open)
}

// comment skips a comment's body, up to and with its "#}".
func (l *lexer) comment() error {
	end := strings.Index(l.src[l.pos:], "#}")
	if end < 0 {
		return &SyntaxError{l.line, "unclosed comment"}
	}
	body := l.src[l.pos : l.pos+end]
	l.line += strings.Count(body, "\n")
	l.pos += end + 2
	if strings.HasSuffix(body, "-") {
		l.stripAll = true
	} else {
		l.stripNL = true
	}
	return nil
}

// expr lexes a "{{ ... }}" or "{% ... %}" tag after its opening.
func (l *lexer) expr(open string) error {
	closing := "}}"
	kind, endKind := tVarBegin, tVarEnd
	if open == "{%" {
		closing, kind, endKind = "%}", tBlockBegin, tBlockEnd
	}
	l.toks = append(l.toks, token{kind: kind, val: open, line: l.line})
	var err error
	var trimRight bool
	l.toks, l.pos, l.line, trimRight, err = lexExpr(l.src, l.pos, l.line, closing, l.toks)
	if err != nil {
		return err
	}
	l.toks = append(l.toks, token{kind: endKind, val: closing, line: l.line})
	if trimRight {
		l.stripAll = true
	} else if open == "{%" {
		l.stripNL = true
	}
	return nil
}

// openedRaw reports whether the last tag was {% raw %}.
func (l *lexer) openedRaw() bool {
	toks := l.toks
	n := len(toks)
	return n >= 3 && toks[n-1].kind == tBlockEnd && toks[n-2].kind == tName &&
		toks[n-2].val == "raw" && toks[n-3].kind == tBlockBegin
}

// raw replaces the {% raw %} tag's tokens with the text up to {% endraw %}.
func (l *lexer) raw() error {
	src, pos := l.src, l.pos
	l.toks = l.toks[:len(l.toks)-3]
	end := strings.Index(src[pos:], "endraw")
	if end < 0 {
		return &SyntaxError{l.line, "unclosed raw block"}
	}
	start := strings.LastIndex(src[pos:pos+end], "{%")
	if start < 0 {
		return &SyntaxError{l.line, "malformed endraw"}
	}
	raw := src[pos : pos+start]
	if l.stripNL && strings.HasPrefix(raw, "\n") {
		raw = raw[1:]
	}
	if strings.HasPrefix(src[pos+start:], "{%-") {
		raw = strings.TrimRight(raw, " \t\r\n")
	}
	l.text(raw)
	l.line += strings.Count(src[pos:pos+end], "\n")
	close := strings.Index(src[pos+end:], "%}")
	if close < 0 {
		return &SyntaxError{l.line, "unclosed endraw"}
	}
	l.stripAll = src[pos+end+close-1] == '-'
	l.stripNL = !l.stripAll
	l.pos += end + close + 2
	return nil
}

func atLineStart(src string, i int) bool { return i == 0 || src[i-1] == '\n' }

// nextTag is the index of the next "{{", "{%" or "{#" at or after pos, or -1.
func nextTag(src string, pos int) int {
	for {
		i := strings.IndexByte(src[pos:], '{')
		if i < 0 || pos+i+1 >= len(src) {
			return -1
		}
		i += pos
		switch src[i+1] {
		case '{', '%', '#':
			return i
		}
		pos = i + 1
	}
}

// Operators, longest first.
var operators = []string{"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
	"(", ")", "[", "]", "{", "}", ",", ".", ":", "|"}

// lexExpr tokenizes the inside of a tag up to closing. It reports whether the tag
// ended with "-" (strip the whitespace after it).
func lexExpr(src string, pos, line int, closing string, toks []token) ([]token, int, int, bool, error) {
	for {
		for pos < len(src) && strings.IndexByte(" \t\r\n", src[pos]) >= 0 {
			if src[pos] == '\n' {
				line++
			}
			pos++
		}
		if pos >= len(src) {
			return nil, pos, line, false, &SyntaxError{line, "unclosed tag, expected " + closing}
		}
		if strings.HasPrefix(src[pos:], "-"+closing) {
			return toks, pos + 3, line, true, nil
		}
		if strings.HasPrefix(src[pos:], closing) {
			return toks, pos + 2, line, false, nil
		}
		c := src[pos]
		switch {
		case c == '"' || c == '\'':
			s, n, err := lexString(src[pos:])
			if err != nil {
				return nil, pos, line, false, &SyntaxError{line, err.Error()}
			}
			line += strings.Count(src[pos:pos+n], "\n")
			toks = append(toks, token{kind: tString, val: s, line: line})
			pos += n
		case c >= '0' && c <= '9':
			start := pos
			kind := tInt
			for pos < len(src) && (src[pos] >= '0' && src[pos] <= '9' || src[pos] == '_') {
				pos++
			}
			if pos+1 < len(src) && src[pos] == '.' && src[pos+1] >= '0' && src[pos+1] <= '9' {
				kind = tFloat
				pos++
				for pos < len(src) && src[pos] >= '0' && src[pos] <= '9' {
					pos++
				}
			}
			if pos < len(src) && (src[pos] == 'e' || src[pos] == 'E') {
				kind = tFloat
				pos++
				if pos < len(src) && (src[pos] == '+' || src[pos] == '-') {
					pos++
				}
				for pos < len(src) && src[pos] >= '0' && src[pos] <= '9' {
					pos++
				}
			}
			toks = append(toks, token{kind: kind, val: strings.ReplaceAll(src[start:pos], "_", ""), line: line})
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			start := pos
			for pos < len(src) && (src[pos] == '_' || src[pos] >= 'a' && src[pos] <= 'z' ||
				src[pos] >= 'A' && src[pos] <= 'Z' || src[pos] >= '0' && src[pos] <= '9') {
				pos++
			}
			toks = append(toks, token{kind: tName, val: src[start:pos], line: line})
		default:
			matched := false
			for _, op := range operators {
				if strings.HasPrefix(src[pos:], op) {
					toks = append(toks, token{kind: tOp, val: op, line: line})
					pos += len(op)
					matched = true
					break
				}
			}
			if !matched {
				return nil, pos, line, false, &SyntaxError{line, fmt.Sprintf("unexpected character %q", c)}
			}
		}
	}
}

// lexString reads a quoted string literal with Python escapes; it returns the value and
// the bytes consumed.
func lexString(s string) (string, int, error) {
	q := s[0]
	var sb strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q:
			return sb.String(), i + 1, nil
		case c == '\\' && i+1 < len(s):
			i++
			switch s[i] {
			case 'n':
				sb.WriteByte('\n')
			case 't':
				sb.WriteByte('\t')
			case 'r':
				sb.WriteByte('\r')
			case '\\', '\'', '"':
				sb.WriteByte(s[i])
			case '\n':
			default:
				sb.WriteByte('\\')
				sb.WriteByte(s[i])
			}
		default:
			sb.WriteByte(c)
		}
	}
	return "", 0, fmt.Errorf("unterminated string")
}

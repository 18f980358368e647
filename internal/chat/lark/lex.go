package lark

import (
	"strings"
	"unicode"
)

// tokKind is the kind of a token of a Lark grammar's text.
type tokKind int

const (
	tEOF tokKind = iota
	tNL
	tName      // a rule (lower case) or terminal (upper case) name, with any ?/! mark
	tString    // "..." or "..."i, as written
	tRegex     // /.../flags, as written
	tNumber    // digits
	tDirective // %import, %ignore, ...
	tPunct     // : | ( ) [ ] ? * + ~ .. . -> , { }
)

type token struct {
	kind tokKind
	text string
	line int
}

// lex splits a grammar into tokens. A newline followed by a line that begins with
// "|" continues the rule, as in Lark; comments (//) are dropped.
func lex(src string) ([]token, *Error) {
	var toks []token
	line := 1
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '\n':
			if n := len(toks); n > 0 && toks[n-1].kind != tNL {
				toks = append(toks, token{tNL, "\n", line})
			}
			line++
			i++
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case strings.HasPrefix(src[i:], "//"):
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == '"':
			j, e := scanQuoted(src, i, '"', line)
			if e != nil {
				return nil, e
			}
			if j < len(src) && src[j] == 'i' {
				j++
			}
			toks = append(toks, token{tString, src[i:j], line})
			i = j
		case c == '/':
			j, e := scanQuoted(src, i, '/', line)
			if e != nil {
				return nil, e
			}
			for j < len(src) && strings.IndexByte("imslux", src[j]) >= 0 {
				j++
			}
			toks = append(toks, token{tRegex, src[i:j], line})
			i = j
		case c == '%' || c == '_' || c == '?' && i+1 < len(src) && isLetter(src[i+1]) || c == '!' || isLetter(c):
			j := i + 1
			for j < len(src) && (isLetter(src[j]) || src[j] == '_' || src[j] >= '0' && src[j] <= '9') {
				j++
			}
			kind := tName
			if c == '%' {
				kind = tDirective
			}
			toks = append(toks, token{kind, src[i:j], line})
			i = j
		case c >= '0' && c <= '9':
			j := i
			for j < len(src) && src[j] >= '0' && src[j] <= '9' {
				j++
			}
			toks = append(toks, token{tNumber, src[i:j], line})
			i = j
		case strings.HasPrefix(src[i:], "..") || strings.HasPrefix(src[i:], "->"):
			toks = append(toks, token{tPunct, src[i : i+2], line})
			i += 2
		case strings.IndexByte(":|()[]?*+~.,{}", c) >= 0:
			if c == '|' && len(toks) > 0 && toks[len(toks)-1].kind == tNL {
				toks = toks[:len(toks)-1]
			}
			toks = append(toks, token{tPunct, string(c), line})
			i++
		default:
			r := []rune(src[i:])[0]
			if unicode.IsSpace(r) {
				i += len(string(r))
				continue
			}
			return nil, errorf(line, "syntax", "unexpected %q in the grammar", r)
		}
	}
	return append(toks, token{tNL, "\n", line}, token{tEOF, "", line}), nil
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// scanQuoted returns the end (past the closing quote) of the quoted text at src[i].
func scanQuoted(src string, i int, quote byte, line int) (int, *Error) {
	for j := i + 1; j < len(src); j++ {
		switch src[j] {
		case '\\':
			j++
		case '\n':
			return 0, errorf(line, "syntax", "%c...%c is not closed on its line", quote, quote)
		case quote:
			return j + 1, nil
		}
	}
	return 0, errorf(line, "syntax", "%c...%c is not closed", quote, quote)
}

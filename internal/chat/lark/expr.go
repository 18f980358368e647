// Package lark reads the grammars of freeform (custom) tools — the Lark grammars and
// regular expressions an OpenAI Responses request puts in a custom tool's
// format, as Codex's apply_patch sends it — and translates them into GBNF rules for
// llama.cpp's grammar sampler, either as the text itself or as that text written
// inside a JSON string (a tool call's {"input": "..."}). It also matches text against
// a grammar, so tests and callers can check an answer. Constructs it does not
// translate are errors that name them, never dropped.
//
// A Lark grammar is read as the context-free language of its rules and terminals
// (terminals are inlined: there is no separate lexer), which is what a constrained
// sampler can enforce.
package lark

import (
	"fmt"
	"slices"
	"unicode/utf8"
)

// expr is a node of a translated grammar.
type expr interface{ isExpr() }

type (
	// lit is a literal string.
	lit string
	// class is one character of a set: sorted, merged, inclusive [lo, hi] pairs.
	class []rune
	// ref names a rule (or terminal).
	ref string
	// seq matches its parts one after another (empty: the empty string).
	seq []expr
	// alt matches any one of its choices.
	alt []expr
	// rep matches x between min and max times (max < 0: unbounded).
	rep struct {
		x        expr
		min, max int
	}
)

func (lit) isExpr()   {}
func (class) isExpr() {}
func (ref) isExpr()   {}
func (seq) isExpr()   {}
func (alt) isExpr()   {}
func (rep) isExpr()   {}

// MaxRepeat bounds the counts of a {m,n} repetition: llama.cpp expands it into that
// many copies.
const MaxRepeat = 64

// anyChar is every character (NUL aside: llama.cpp ends its strings with it).
var anyChar = class{1, utf8.MaxRune}

// newClass is the class of pairs (lo, hi, lo, hi, ...), sorted and merged.
func newClass(pairs []rune) class {
	type r struct{ lo, hi rune }
	var rs []r
	for i := 0; i+1 < len(pairs); i += 2 {
		lo, hi := max(pairs[i], 1), pairs[i+1]
		if lo <= hi {
			rs = append(rs, r{lo, hi})
		}
	}
	slices.SortFunc(rs, func(a, b r) int { return int(a.lo - b.lo) })
	var out class
	for _, x := range rs {
		if n := len(out); n > 0 && x.lo <= out[n-1]+1 {
			out[n-1] = max(out[n-1], x.hi)
			continue
		}
		out = append(out, x.lo, x.hi)
	}
	return out
}

// minus is c without the characters of d.
func (c class) minus(d class) class {
	var out []rune
	for i := 0; i < len(c); i += 2 {
		lo, hi := c[i], c[i+1]
		for j := 0; j < len(d) && lo <= hi; j += 2 {
			if d[j+1] < lo || d[j] > hi {
				continue
			}
			if d[j] > lo {
				out = append(out, lo, d[j]-1)
			}
			lo = d[j+1] + 1
		}
		if lo <= hi {
			out = append(out, lo, hi)
		}
	}
	return newClass(out)
}

// has reports whether c holds r.
func (c class) has(r rune) bool {
	for i := 0; i < len(c); i += 2 {
		if r >= c[i] && r <= c[i+1] {
			return true
		}
	}
	return false
}

// Error is a grammar that cannot be translated: where, which construct, and why.
type Error struct {
	// Line is the definition's line (1-based), 0 where it is not known.
	Line int
	// Construct names what is refused (e.g. "%ignore", "left recursion").
	Construct string
	Msg       string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	}
	return e.Msg
}

func errorf(line int, construct, format string, args ...any) *Error {
	return &Error{Line: line, Construct: construct, Msg: fmt.Sprintf(format, args...)}
}

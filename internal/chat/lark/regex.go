package lark

import (
	"regexp/syntax"
	"strings"
	"unicode"
)

// fromRegex translates a regular expression (RE2 syntax, which the Rust syntax of a
// regex format and the Python one of Lark's /.../ terminals share for what grammars
// use) matched against the whole text: anchors are allowed only at its ends.
func fromRegex(pattern string, flags syntax.Flags, line int) (expr, *Error) {
	re, err := syntax.Parse(pattern, flags)
	if err != nil {
		return nil, errorf(line, "regex", "the regular expression %q does not parse: %v "+
			"(lookaround and backreferences are not supported)", clip(pattern), err)
	}
	re = trimAnchors(re)
	return regexExpr(re, line)
}

// trimAnchors drops the ^ and $ (\A, \z) at the ends of a whole-text pattern.
func trimAnchors(re *syntax.Regexp) *syntax.Regexp {
	isAnchor := func(r *syntax.Regexp, begin bool) bool {
		if begin {
			return r.Op == syntax.OpBeginText || r.Op == syntax.OpBeginLine
		}
		return r.Op == syntax.OpEndText || r.Op == syntax.OpEndLine
	}
	if re.Op != syntax.OpConcat {
		if isAnchor(re, true) || isAnchor(re, false) {
			return &syntax.Regexp{Op: syntax.OpEmptyMatch}
		}
		return re
	}
	subs := re.Sub
	if len(subs) > 0 && isAnchor(subs[0], true) {
		subs = subs[1:]
	}
	if len(subs) > 0 && isAnchor(subs[len(subs)-1], false) {
		subs = subs[:len(subs)-1]
	}
	out := *re
	out.Sub = subs
	return &out
}

// regexExpr translates one node of a parsed expression.
func regexExpr(re *syntax.Regexp, line int) (expr, *Error) {
	switch re.Op {
	case syntax.OpEmptyMatch:
		return seq{}, nil
	case syntax.OpLiteral:
		if re.Flags&syntax.FoldCase == 0 {
			return lit(string(re.Rune)), nil
		}
		var s seq
		for _, r := range re.Rune {
			s = append(s, foldClass(r))
		}
		return s, nil
	case syntax.OpCharClass:
		return newClass(re.Rune), nil
	case syntax.OpAnyCharNotNL:
		return anyChar.minus(class{'\n', '\n'}), nil
	case syntax.OpAnyChar:
		return anyChar, nil
	case syntax.OpCapture:
		return regexExpr(re.Sub[0], line)
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		x, e := regexExpr(re.Sub[0], line)
		if e != nil {
			return nil, e
		}
		lo, hi := re.Min, re.Max
		switch re.Op {
		case syntax.OpStar:
			lo, hi = 0, -1
		case syntax.OpPlus:
			lo, hi = 1, -1
		case syntax.OpQuest:
			lo, hi = 0, 1
		}
		if lo > MaxRepeat || hi > MaxRepeat {
			return nil, errorf(line, "repetition", "a repetition of at most %d is supported, got {%d,%d}", MaxRepeat, lo, hi)
		}
		return rep{x, lo, hi}, nil
	case syntax.OpConcat, syntax.OpAlternate:
		var parts []expr
		for _, sub := range re.Sub {
			x, e := regexExpr(sub, line)
			if e != nil {
				return nil, e
			}
			parts = append(parts, x)
		}
		if re.Op == syntax.OpConcat {
			return seq(parts), nil
		}
		return alt(parts), nil
	case syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText:
		return nil, errorf(line, "anchor", "anchors (^, $) are supported only at the ends of a regular expression, which is matched whole")
	case syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return nil, errorf(line, "word boundary", "word boundaries (\\b, \\B) are not supported")
	}
	return nil, errorf(line, "regex", "the regular expression %q matches nothing", clip(re.String()))
}

// foldClass is r in every case.
func foldClass(r rune) class {
	pairs := []rune{r, r}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		pairs = append(pairs, f, f)
	}
	return newClass(pairs)
}

// clip is s cut for an error message.
func clip(s string) string {
	if len(s) <= 60 {
		return s
	}
	return strings.ToValidUTF8(s[:60], "") + "…"
}

package lark

import (
	"regexp/syntax"
	"strconv"
	"strings"
)

// MaxDefinitionBytes bounds a grammar's text.
const MaxDefinitionBytes = 64 << 10

// MaxNesting bounds how deep groups ( ) and [ ] nest: llama.cpp's grammar parser
// recurses once per level on its thread's stack, and a grammar nested some twenty
// thousand deep overflowed it (the runner died with every request it held).
const MaxNesting = 64

// Grammar is a translated grammar: named rules, one of them the start.
type Grammar struct {
	rules map[string]expr
	// order is the rules' names in the order they were defined (the output's order).
	order []string
	start string
}

// Parse translates a custom tool's grammar: syntax "lark" (a Lark grammar whose start
// rule is "start") or "regex" (a regular expression the whole text matches).
func Parse(syntaxName, definition string) (*Grammar, error) {
	if len(definition) > MaxDefinitionBytes {
		return nil, errorf(0, "size", "the grammar is %d bytes, more than the %d supported", len(definition), MaxDefinitionBytes)
	}
	if strings.TrimSpace(definition) == "" {
		return nil, errorf(0, "definition", "the grammar's definition is empty")
	}
	var g *Grammar
	var e *Error
	switch syntaxName {
	case "lark":
		g, e = parseLark(definition)
	case "regex":
		var x expr
		if x, e = fromRegex(definition, syntax.Perl, 0); e == nil {
			g = &Grammar{rules: map[string]expr{"start": x}, order: []string{"start"}, start: "start"}
		}
	default:
		return nil, errorf(0, "syntax", "the grammar syntax must be lark or regex, got %q", syntaxName)
	}
	if e != nil {
		return nil, e
	}
	if e := g.check(); e != nil {
		return nil, e
	}
	return g, nil
}

// parser reads the tokens of a Lark grammar.
type parser struct {
	toks []token
	pos  int
	g    *Grammar
	// lines are where each name was defined, used, or imported (for errors).
	lines map[string]int
	// depth is how many groups the parser is inside.
	depth int
}

func (p *parser) peek() token { return p.toks[p.pos] }
func (p *parser) next() token { t := p.toks[p.pos]; p.pos++; return t }
func (p *parser) punct(s string) bool {
	if t := p.peek(); t.kind == tPunct && t.text == s {
		p.pos++
		return true
	}
	return false
}

func parseLark(src string) (*Grammar, *Error) {
	toks, e := lex(src)
	if e != nil {
		return nil, e
	}
	p := &parser{toks: toks, g: &Grammar{rules: map[string]expr{}, start: "start"}, lines: map[string]int{}}
	for p.peek().kind != tEOF {
		if p.peek().kind == tNL {
			p.pos++
			continue
		}
		if e := p.statement(); e != nil {
			return nil, e
		}
	}
	return p.g, nil
}

// statement reads one definition or directive, through its newline.
func (p *parser) statement() *Error {
	t := p.next()
	switch {
	case t.kind == tDirective && t.text == "%import":
		return p.importStmt(t.line)
	case t.kind == tDirective:
		return errorf(t.line, t.text, "%s is not supported (it changes what the grammar accepts in ways a sampler cannot follow)", t.text)
	case t.kind != tName:
		return errorf(t.line, "syntax", "a rule or terminal definition must start with its name, got %q", t.text)
	}
	name := strings.TrimLeft(t.text, "?!")
	if p.punct("{") {
		return errorf(t.line, "template", "rule templates (%s{...}) are not supported", name)
	}
	if p.punct(".") { // a priority: it orders matches, the language is the same
		if n := p.next(); n.kind != tNumber {
			return errorf(t.line, "syntax", "a priority is a number, got %q", n.text)
		}
	}
	if !p.punct(":") {
		return errorf(t.line, "syntax", "expected \":\" after %s, got %q", name, p.peek().text)
	}
	if _, dup := p.g.rules[name]; dup {
		return errorf(t.line, "syntax", "%s is defined twice", name)
	}
	x, e := p.expansions()
	if e != nil {
		return e
	}
	if n := p.next(); n.kind != tNL {
		return errorf(n.line, "syntax", "unexpected %q in the definition of %s", n.text, name)
	}
	p.define(name, x, t.line)
	return nil
}

func (p *parser) define(name string, x expr, line int) {
	p.g.rules[name] = x
	p.g.order = append(p.g.order, name)
	p.lines[name] = line
}

// expansions reads alternatives: alias ("|" alias)*.
func (p *parser) expansions() (expr, *Error) {
	var alts alt
	for {
		x, e := p.expansion()
		if e != nil {
			return nil, e
		}
		if p.punct("->") { // an alias names the tree node, the language is the same
			if n := p.next(); n.kind != tName {
				return nil, errorf(n.line, "syntax", "an alias (->) is followed by a name, got %q", n.text)
			}
		}
		alts = append(alts, x)
		if !p.punct("|") {
			break
		}
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return alts, nil
}

// expansion reads a sequence of items up to "|", ")", "]", "->" or the line's end.
func (p *parser) expansion() (expr, *Error) {
	var s seq
	for {
		t := p.peek()
		if t.kind == tNL || t.kind == tEOF || t.kind == tPunct && strings.Contains("|)]->,}", t.text) && t.text != "-" {
			break
		}
		x, e := p.item()
		if e != nil {
			return nil, e
		}
		s = append(s, x)
	}
	if len(s) == 1 {
		return s[0], nil
	}
	return s, nil
}

// item reads an atom and its operator: ?, *, +, ~ n, ~ n..m.
func (p *parser) item() (expr, *Error) {
	x, e := p.atom()
	if e != nil {
		return nil, e
	}
	switch {
	case p.punct("?"):
		return rep{x, 0, 1}, nil
	case p.punct("*"):
		return rep{x, 0, -1}, nil
	case p.punct("+"):
		return rep{x, 1, -1}, nil
	case p.punct("~"):
		lo, e := p.number()
		if e != nil {
			return nil, e
		}
		hi := lo
		if p.punct("..") {
			if hi, e = p.number(); e != nil {
				return nil, e
			}
		}
		if lo > hi || hi > MaxRepeat {
			return nil, errorf(p.peek().line, "repetition", "a repetition (~) of %d..%d is not supported (at most %d)", lo, hi, MaxRepeat)
		}
		return rep{x, lo, hi}, nil
	}
	return x, nil
}

func (p *parser) number() (int, *Error) {
	t := p.next()
	n, err := strconv.Atoi(t.text)
	if t.kind != tNumber || err != nil {
		return 0, errorf(t.line, "syntax", "expected a number, got %q", t.text)
	}
	return n, nil
}

// atom reads ( ... ), [ ... ], a string (or a range of two), a regex or a name.
func (p *parser) atom() (expr, *Error) {
	t := p.next()
	switch {
	case t.kind == tPunct && (t.text == "(" || t.text == "["):
		if p.depth++; p.depth > MaxNesting {
			return nil, errorf(t.line, "nesting", "groups nest more than %d deep", MaxNesting)
		}
		x, e := p.expansions()
		p.depth--
		if e != nil {
			return nil, e
		}
		closing := map[string]string{"(": ")", "[": "]"}[t.text]
		if !p.punct(closing) {
			return nil, errorf(t.line, "syntax", "%s is not closed by %s", t.text, closing)
		}
		if t.text == "[" {
			return rep{x, 0, 1}, nil
		}
		return x, nil
	case t.kind == tString:
		return p.stringAtom(t)
	case t.kind == tRegex:
		return larkRegex(t)
	case t.kind == tName:
		name := strings.TrimLeft(t.text, "?!")
		if p.punct("{") {
			return nil, errorf(t.line, "template", "rule templates (%s{...}) are not supported", name)
		}
		if _, seen := p.lines[name]; !seen {
			p.lines[name] = t.line
		}
		return ref(name), nil
	}
	return nil, errorf(t.line, "syntax", "unexpected %q", t.text)
}

// stringAtom is a literal, a case-insensitive one ("..."i), or a range "a".."z".
func (p *parser) stringAtom(t token) (expr, *Error) {
	s, fold, e := unquote(t)
	if e != nil {
		return nil, e
	}
	if p.punct("..") {
		u := p.next()
		if u.kind != tString {
			return nil, errorf(u.line, "syntax", "a range (..) joins two strings, got %q", u.text)
		}
		hi, _, e := unquote(u)
		if e != nil {
			return nil, e
		}
		lo, h := []rune(s), []rune(hi)
		if len(lo) != 1 || len(h) != 1 || lo[0] > h[0] {
			return nil, errorf(t.line, "range", "a range joins two single characters in order, got %s..%s", t.text, u.text)
		}
		return newClass([]rune{lo[0], h[0]}), nil
	}
	if !fold {
		return lit(s), nil
	}
	var out seq
	for _, r := range s {
		out = append(out, foldClass(r))
	}
	return out, nil
}

// unquote is a string token's text and whether it is case-insensitive.
func unquote(t token) (string, bool, *Error) {
	text, fold := strings.CutSuffix(t.text, "i")
	s, err := strconv.Unquote(text)
	if err != nil {
		return "", false, errorf(t.line, "string", "the string %s does not parse: %v", clip(t.text), err)
	}
	return s, fold, nil
}

// larkRegex translates a /.../flags terminal.
func larkRegex(t token) (expr, *Error) {
	end := strings.LastIndexByte(t.text, '/')
	body, flagText := strings.ReplaceAll(t.text[1:end], `\/`, "/"), t.text[end+1:]
	flags := syntax.Perl
	for _, f := range flagText {
		switch f {
		case 'i':
			flags |= syntax.FoldCase
		case 's':
			flags |= syntax.DotNL
		case 'm':
			flags &^= syntax.OneLine
		case 'u':
		default:
			return nil, errorf(t.line, "regex flag", "the regex flag %q is not supported (i, s, m and u are)", f)
		}
	}
	return fromRegex(body, flags, t.line)
}

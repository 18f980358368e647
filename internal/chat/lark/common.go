package lark

import (
	"maps"
	"regexp/syntax"
	"slices"
	"strings"
)

// common are the terminals of Lark's "common" module that %import may name, as
// regular expressions of what each matches.
var common = map[string]string{
	"LF":             `\n`,
	"CR":             `\r`,
	"NEWLINE":        `(\r?\n)+`,
	"WS":             `[ \t\f\r\n]+`,
	"WS_INLINE":      `[ \t]+`,
	"DIGIT":          `[0-9]`,
	"HEXDIGIT":       `[0-9a-fA-F]`,
	"INT":            `[0-9]+`,
	"SIGNED_INT":     `[+-]?[0-9]+`,
	"DECIMAL":        `[0-9]+\.[0-9]*|\.[0-9]+`,
	"NUMBER":         `[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?`,
	"SIGNED_NUMBER":  `[+-]?([0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?)`,
	"LETTER":         `[a-zA-Z]`,
	"UCASE_LETTER":   `[A-Z]`,
	"LCASE_LETTER":   `[a-z]`,
	"WORD":           `[a-zA-Z]+`,
	"CNAME":          `[_a-zA-Z][_a-zA-Z0-9]*`,
	"ESCAPED_STRING": `"([^"\\\n]|\\.)*"`,
}

// importStmt reads the rest of an %import: common.NAME, common.NAME -> ALIAS, or
// common (NAME, NAME, ...).
func (p *parser) importStmt(line int) *Error {
	t := p.next()
	module, name, dotted := strings.Cut(t.text, ".")
	if t.kind != tName {
		return errorf(line, "%import", "%%import names a module, got %q", t.text)
	}
	if !dotted && p.peek().kind == tPunct && p.peek().text == "." {
		p.pos++
		n := p.next()
		name, dotted = n.text, true
	}
	if module != "common" {
		return errorf(line, "%import", "only %%import common.NAME is supported, got %%import %s", t.text)
	}
	var names, aliases []string
	switch {
	case dotted:
		alias := name
		if p.punct("->") {
			alias = p.next().text
		}
		names, aliases = []string{name}, []string{alias}
	case p.punct("("):
		for {
			n := p.next()
			names, aliases = append(names, n.text), append(aliases, n.text)
			if !p.punct(",") {
				break
			}
		}
		if !p.punct(")") {
			return errorf(line, "%import", "%%import common (...) is not closed")
		}
	default:
		return errorf(line, "%import", "%%import common needs a name: common.NAME or common (NAME, ...)")
	}
	if n := p.next(); n.kind != tNL {
		return errorf(line, "%import", "unexpected %q after %%import", n.text)
	}
	for i, name := range names {
		re, ok := common[name]
		if !ok {
			known := slices.Sorted(maps.Keys(common))
			return errorf(line, "%import", "common.%s is not supported; the common terminals supported are %s", name, strings.Join(known, ", "))
		}
		x, e := fromRegex(re, syntax.Perl, line)
		if e != nil {
			return e
		}
		if _, dup := p.g.rules[aliases[i]]; dup {
			return errorf(line, "%import", "%s is defined twice", aliases[i])
		}
		p.define(aliases[i], x, line)
	}
	return nil
}

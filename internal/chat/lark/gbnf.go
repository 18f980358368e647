package lark

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// Rules returns the grammar as GBNF rule bodies (for llama.cpp's grammar builder),
// named prefix + "-" + each rule's name, the start rule named root. With inJSON, the
// rules match the text as it is written inside a JSON string (quotes, backslashes and
// control characters escaped, one way each), so that a call's arguments can hold it.
func (g *Grammar) Rules(root, prefix string, inJSON bool) map[string]string {
	w := &writer{prefix: prefix, inJSON: inJSON, out: map[string]string{}, classes: map[string]string{}}
	for _, name := range g.order {
		w.out[w.name(name)] = w.expr(g.rules[name], false)
	}
	w.out[root] = w.name(g.start)
	return w.out
}

// GBNF is the grammar as one GBNF text whose root is the start rule (the text itself,
// not JSON-escaped).
func (g *Grammar) GBNF() string {
	rules := g.Rules("root", "lark", false)
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(rules)) {
		fmt.Fprintf(&b, "%s ::= %s\n", name, rules[name])
	}
	return b.String()
}

// writer writes expressions as GBNF.
type writer struct {
	prefix string
	inJSON bool
	out    map[string]string
	// classes are the rules written for character classes (inJSON: a class is an
	// alternation), by their body.
	classes map[string]string
}

// name is the GBNF name of a grammar rule: its letters, digits and "-" for "_"
// (Lark names hold no "-"), after the prefix.
func (w *writer) name(n string) string { return w.prefix + "-" + strings.ReplaceAll(n, "_", "-") }

// expr writes x; nested reports whether it sits inside a sequence or repetition
// (and needs parentheses if it is an alternation).
func (w *writer) expr(x expr, nested bool) string {
	switch x := x.(type) {
	case lit:
		if x == "" {
			return `""`
		}
		return w.literal(string(x))
	case class:
		return w.class(x)
	case ref:
		return w.name(string(x))
	case seq:
		if len(x) == 0 {
			return `""`
		}
		parts := make([]string, len(x))
		for i, y := range x {
			parts[i] = w.expr(y, true)
		}
		return group(strings.Join(parts, " "), nested && len(x) > 1)
	case alt:
		parts := make([]string, len(x))
		for i, y := range x {
			parts[i] = w.expr(y, false)
		}
		return group(strings.Join(parts, " | "), nested)
	case rep:
		inner := "(" + w.expr(x.x, false) + ")"
		switch {
		case x.min == 0 && x.max == 1:
			return inner + "?"
		case x.min == 0 && x.max < 0:
			return inner + "*"
		case x.min == 1 && x.max < 0:
			return inner + "+"
		case x.max < 0:
			return fmt.Sprintf("%s{%d,}", inner, x.min)
		}
		return fmt.Sprintf("%s{%d,%d}", inner, x.min, x.max)
	}
	panic(fmt.Sprintf("lark: unknown expression %T", x))
}

func group(s string, paren bool) string {
	if paren {
		return "(" + s + ")"
	}
	return s
}

// jsonEscape is how r is written inside a JSON string, "" where it is written as is.
func jsonEscape(r rune) string {
	switch r {
	case '"':
		return `\"`
	case '\\':
		return `\\`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	}
	if r < 0x20 {
		return fmt.Sprintf(`\u%04x`, r)
	}
	return ""
}

// literal is text as a GBNF string literal (as written in JSON where inJSON).
func (w *writer) literal(text string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range text {
		s := string(r)
		if e := jsonEscape(r); e != "" && w.inJSON {
			s = e
		}
		for _, c := range s {
			b.WriteString(gbnfChar(c, false))
		}
	}
	b.WriteByte('"')
	return b.String()
}

// gbnfChar is c as written in a GBNF literal, or in a character class (inClass).
func gbnfChar(c rune, inClass bool) string {
	switch {
	case c == '"' || c == '\\' || inClass && (c == ']' || c == '[' || c == '-' || c == '^'):
		return fmt.Sprintf(`\x%02X`, c)
	case c < 0x20 || c == 0x7F:
		return fmt.Sprintf(`\x%02X`, c)
	case c > 0xFFFF:
		return fmt.Sprintf(`\U%08X`, c)
	case c >= 0xD800 && c <= 0xDFFF, c >= 0x80 && !utf8.ValidRune(c):
		return fmt.Sprintf(`\u%04X`, c)
	}
	return string(c)
}

// class writes a character class; inJSON, the characters JSON escapes are their
// escapes: one alternative for the others, one for a backslash and what follows it
// (so that the sampler keeps few alternatives open). Each distinct class is one rule.
func (w *writer) class(c class) string {
	body := classBody(c)
	if w.inJSON {
		special := class{1, 0x1F, '"', '"', '\\', '\\'}
		var alts []string
		if plain := c.minus(special); len(plain) > 0 {
			alts = append(alts, classBody(plain))
		}
		if esc := escapes(c); esc != "" {
			alts = append(alts, `"\x5C" `+esc)
		}
		body = strings.Join(alts, " | ")
	}
	if name, ok := w.classes[body]; ok {
		return name
	}
	// Lark names are all lower or all upper case: "Cc" is none of theirs.
	name := fmt.Sprintf("%s-Cc%d", w.prefix, len(w.classes))
	w.classes[body] = name
	w.out[name] = body
	return name
}

// escapes is what may follow the backslash of an escape of a character of c, as
// jsonEscape writes it ("" if none): one of the letters (or " and \), or u00 and two
// hex digits.
func escapes(c class) string {
	var short []rune
	var ctl [2][]rune // \u000X and \u001X: their last hex digits
	for r := rune(1); r <= '\\'; r++ {
		e := jsonEscape(r)
		switch {
		case !c.has(r) || e == "":
		case len(e) == 2:
			short = append(short, rune(e[1]), rune(e[1]))
		default:
			ctl[r>>4] = append(ctl[r>>4], rune(e[5]), rune(e[5]))
		}
	}
	var alts []string
	if len(short) > 0 {
		alts = append(alts, classBody(newClass(short)))
	}
	var u []string
	for hi, lows := range ctl {
		if len(lows) > 0 {
			u = append(u, fmt.Sprintf(`"%d" %s`, hi, classBody(newClass(lows))))
		}
	}
	if len(u) > 0 {
		alts = append(alts, `"u00" (`+strings.Join(u, " | ")+`)`)
	}
	if len(alts) == 0 {
		return ""
	}
	return "(" + strings.Join(alts, " | ") + ")"
}

// classBody is c as a GBNF class [...].
func classBody(c class) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := 0; i < len(c); i += 2 {
		b.WriteString(gbnfChar(c[i], true))
		if c[i+1] != c[i] {
			b.WriteByte('-')
			b.WriteString(gbnfChar(c[i+1], true))
		}
	}
	b.WriteByte(']')
	return b.String()
}

// ArgumentRules are the GBNF rules of a freeform tool call's arguments, the JSON
// object {"input": "..."} whose string holds text of the grammar: the rule named name
// and the grammar's own rules (named name + "-" + theirs).
func (g *Grammar) ArgumentRules(name string) map[string]string {
	rules := g.Rules(name+"-Text", name, true) // mixed case: no Lark name
	rules[name] = `"{\"input\": \"" ` + name + `-Text "\"}"`
	return rules
}

package jinja

import (
	"fmt"
	"strconv"
)

// Expressions, lowest precedence first.

func (p *parser) parseExpr() (expr, error) {
	if err := p.nest(); err != nil {
		return nil, err
	}
	defer p.unnest()
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.isName("if") {
		p.next()
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var els expr = literal{Undefined{}}
		if p.isName("else") {
			p.next()
			if els, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		e = condExpr{then: e, cond: cond, els: els}
	}
	return e, nil
}

func (p *parser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	for err == nil && p.isName("or") {
		line := p.next().line
		var r expr
		if r, err = p.parseAnd(); err == nil {
			l = binaryExpr{op: "or", l: l, r: r, line: line}
		}
	}
	return l, err
}

func (p *parser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	for err == nil && p.isName("and") {
		line := p.next().line
		var r expr
		if r, err = p.parseNot(); err == nil {
			l = binaryExpr{op: "and", l: l, r: r, line: line}
		}
	}
	return l, err
}

func (p *parser) parseNot() (expr, error) {
	if p.isName("not") {
		if err := p.nest(); err != nil {
			return nil, err
		}
		defer p.unnest()
		p.next()
		x, err := p.parseNot()
		return unaryExpr{op: "not", x: x}, err
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	l, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	for {
		t := p.peek()
		var op string
		switch {
		case t.kind == tOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == ">" || t.val == "<=" || t.val == ">="):
			op = t.val
			p.next()
		case t.kind == tName && t.val == "in":
			op = "in"
			p.next()
		case t.kind == tName && t.val == "not" && p.toks[p.pos+1].kind == tName && p.toks[p.pos+1].val == "in":
			op = "not in"
			p.next()
			p.next()
		default:
			return l, nil
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		l = binaryExpr{op: op, l: l, r: r, line: t.line}
	}
}

func (p *parser) parseMath1() (expr, error) {
	l, err := p.parseConcat()
	for err == nil && (p.isOp("+") || p.isOp("-")) {
		t := p.next()
		var r expr
		if r, err = p.parseConcat(); err == nil {
			l = binaryExpr{op: t.val, l: l, r: r, line: t.line}
		}
	}
	return l, err
}

func (p *parser) parseConcat() (expr, error) {
	l, err := p.parseMath2()
	for err == nil && p.isOp("~") {
		t := p.next()
		var r expr
		if r, err = p.parseMath2(); err == nil {
			l = binaryExpr{op: "~", l: l, r: r, line: t.line}
		}
	}
	return l, err
}

func (p *parser) parseMath2() (expr, error) {
	l, err := p.parsePow()
	for err == nil && (p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%")) {
		t := p.next()
		var r expr
		if r, err = p.parsePow(); err == nil {
			l = binaryExpr{op: t.val, l: l, r: r, line: t.line}
		}
	}
	return l, err
}

func (p *parser) parsePow() (expr, error) {
	l, err := p.parseUnary()
	for err == nil && p.isOp("**") {
		t := p.next()
		var r expr
		if r, err = p.parseUnary(); err == nil {
			l = binaryExpr{op: "**", l: l, r: r, line: t.line}
		}
	}
	return l, err
}

func (p *parser) parseUnary() (expr, error) {
	var e expr
	var err error
	if p.isOp("-") || p.isOp("+") {
		// Filters apply to the negated value: -x|abs is (-x)|abs.
		op := p.next().val
		x, err := p.parseUnaryOperand()
		if err != nil {
			return nil, err
		}
		e = unaryExpr{op: op, x: x}
	} else if e, err = p.parsePostfix(); err != nil {
		return nil, err
	}
	return p.parseFilters(e)
}

func (p *parser) parseUnaryOperand() (expr, error) {
	if p.isOp("-") || p.isOp("+") {
		if err := p.nest(); err != nil {
			return nil, err
		}
		defer p.unnest()
		op := p.next().val
		x, err := p.parseUnaryOperand()
		return unaryExpr{op: op, x: x}, err
	}
	return p.parsePostfix()
}

// parseFilters applies "| filter" and "is test" chains.
func (p *parser) parseFilters(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("|"):
			line := p.next().line
			f, err := p.parseFilter(e, line)
			if err != nil {
				return nil, err
			}
			e = f
		case p.isName("is"):
			line := p.next().line
			t := &testExpr{e: e, line: line}
			if p.isName("not") {
				p.next()
				t.negated = true
			}
			name, err := p.expectName()
			if err != nil {
				return nil, err
			}
			t.name = name
			switch {
			case p.isOp("("):
				p.next()
				args, _, err := p.parseArgs()
				if err != nil {
					return nil, err
				}
				t.args = args
			case p.startsOperand():
				arg, err := p.parsePostfix()
				if err != nil {
					return nil, err
				}
				t.args = []expr{arg}
			}
			e = t
		default:
			return e, nil
		}
	}
}

// startsOperand reports whether the next token can begin a test's single argument
// written without parentheses ("is divisibleby 3", "is sameas false").
func (p *parser) startsOperand() bool {
	t := p.peek()
	switch t.kind {
	case tString, tInt, tFloat:
		return true
	case tName:
		switch t.val {
		case "and", "or", "if", "else", "not", "in", "is", "recursive":
			return false
		}
		return true
	}
	return false
}

func (p *parser) parseFilter(e expr, line int) (*filterExpr, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	f := &filterExpr{e: e, name: name, line: line}
	if p.isOp("(") {
		p.next()
		if f.args, f.kwargs, err = p.parseArgs(); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// parseArgs parses call arguments after "(" up to and including ")".
func (p *parser) parseArgs() ([]expr, []kwarg, error) {
	var args []expr
	var kwargs []kwarg
	for !p.isOp(")") {
		if p.peek().kind == tName && p.toks[p.pos+1].kind == tOp && p.toks[p.pos+1].val == "=" {
			name := p.next().val
			p.next()
			e, err := p.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			kwargs = append(kwargs, kwarg{name, e})
		} else {
			if p.isOp("*") || p.isOp("**") {
				return nil, nil, p.errf("argument unpacking is not supported")
			}
			e, err := p.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			args = append(args, e)
		}
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return args, kwargs, p.expectOp(")")
}

func (p *parser) parsePostfix() (expr, error) {
	e, err := p.parsePrimary()
	if err != nil {
		return nil, err
	}
	for {
		switch {
		case p.isOp("."):
			line := p.next().line
			t := p.next()
			switch t.kind {
			case tName:
				e = attrExpr{obj: e, name: t.val, line: line}
			case tInt:
				i, _ := strconv.ParseInt(t.val, 10, 64)
				e = itemExpr{obj: e, key: literal{i}, line: line}
			default:
				return nil, &SyntaxError{t.line, fmt.Sprintf("expected an attribute name after '.', found %s", t)}
			}
		case p.isOp("["):
			line := p.next().line
			var parts [3]expr
			n := 0
			isSlice := false
			for {
				if !p.isOp(":") && !p.isOp("]") {
					x, err := p.parseExpr()
					if err != nil {
						return nil, err
					}
					parts[n] = x
				}
				if p.isOp(":") && n < 2 {
					p.next()
					n++
					isSlice = true
					continue
				}
				break
			}
			if err := p.expectOp("]"); err != nil {
				return nil, err
			}
			if isSlice {
				e = sliceExpr{obj: e, start: parts[0], stop: parts[1], step: parts[2]}
			} else {
				e = itemExpr{obj: e, key: parts[0], line: line}
			}
		case p.isOp("("):
			line := p.next().line
			args, kwargs, err := p.parseArgs()
			if err != nil {
				return nil, err
			}
			e = callExpr{fn: e, args: args, kwargs: kwargs, line: line}
		default:
			return e, nil
		}
	}
}

func (p *parser) parsePrimary() (expr, error) {
	t := p.next()
	switch t.kind {
	case tString:
		s := t.val
		for p.peek().kind == tString { // adjacent literals concatenate
			s += p.next().val
		}
		return literal{s}, nil
	case tInt:
		i, err := strconv.ParseInt(t.val, 10, 64)
		if err != nil {
			return nil, &SyntaxError{t.line, "integer out of range"}
		}
		return literal{i}, nil
	case tFloat:
		f, _ := strconv.ParseFloat(t.val, 64)
		return literal{f}, nil
	case tName:
		switch t.val {
		case "true", "True":
			return literal{true}, nil
		case "false", "False":
			return literal{false}, nil
		case "none", "None":
			return literal{nil}, nil
		}
		return nameExpr{t.val}, nil
	case tOp:
		switch t.val {
		case "(":
			return p.parseParen()
		case "[":
			return p.parseList()
		case "{":
			return p.parseDict()
		}
	}
	return nil, &SyntaxError{t.line, fmt.Sprintf("unexpected %s", t)}
}

// parseParen parses what follows "(": an empty tuple, a parenthesised expression or a
// tuple (a list).
func (p *parser) parseParen() (expr, error) {
	if p.isOp(")") {
		p.next()
		return listExpr{}, nil
	}
	e, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	if p.isOp(",") { // a tuple
		items := []expr{e}
		for p.isOp(",") {
			p.next()
			if p.isOp(")") {
				break
			}
			x, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			items = append(items, x)
		}
		e = listExpr{items}
	}
	return e, p.expectOp(")")
}

// parseList parses a list literal after "[", a trailing comma allowed.
func (p *parser) parseList() (expr, error) {
	l := listExpr{}
	for !p.isOp("]") {
		x, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		l.items = append(l.items, x)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return l, p.expectOp("]")
}

// parseDict parses a dict literal after "{": key: value pairs, a trailing comma allowed.
func (p *parser) parseDict() (expr, error) {
	d := dictExpr{}
	for !p.isOp("}") {
		k, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		if err := p.expectOp(":"); err != nil {
			return nil, err
		}
		v, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		d.keys, d.vals = append(d.keys, k), append(d.vals, v)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	return d, p.expectOp("}")
}

package jinja

import (
	"fmt"
)

// Statement nodes.
type (
	node       interface{}
	textNode   struct{ s string }
	outputNode struct {
		e    expr
		line int
	}
	ifNode struct {
		conds  []expr
		bodies [][]node
		els    []node
	}
	forNode struct {
		vars     []string
		iter     expr
		cond     expr
		body     []node
		els      []node
		line     int
		recursed bool
	}
	setNode struct {
		name, attr string
		e          expr
		body       []node // block set: {% set x %}...{% endset %}
		line       int
	}
	macroNode struct {
		name   string
		params []param
		body   []node
	}
	callBlockNode struct {
		call expr
		body []node
		line int
	}
	filterBlockNode struct {
		filter *filterExpr
		body   []node
	}
	breakNode    struct{}
	continueNode struct{}
)

type param struct {
	name string
	def  expr
}

// Expression nodes.
type (
	expr     interface{}
	literal  struct{ v any }
	nameExpr struct{ name string }
	listExpr struct{ items []expr }
	dictExpr struct{ keys, vals []expr }
	attrExpr struct {
		obj  expr
		name string
		line int
	}
	itemExpr struct {
		obj, key expr
		line     int
	}
	sliceExpr struct {
		obj               expr
		start, stop, step expr
	}
	callExpr struct {
		fn     expr
		args   []expr
		kwargs []kwarg
		line   int
	}
	filterExpr struct {
		e      expr
		name   string
		args   []expr
		kwargs []kwarg
		line   int
	}
	testExpr struct {
		e       expr
		name    string
		args    []expr
		negated bool
		line    int
	}
	unaryExpr struct {
		op string
		x  expr
	}
	binaryExpr struct {
		op   string
		l, r expr
		line int
	}
	condExpr struct{ then, cond, els expr }
)

type kwarg struct {
	name string
	e    expr
}

type parser struct {
	toks []token
	pos  int
	// depth is the nesting of the blocks and expressions being parsed.
	depth int
}

// nest counts one level of nesting, refusing more than MaxNesting; the caller
// defers p.unnest().
func (p *parser) nest() error {
	p.depth++
	if p.depth > MaxNesting {
		return &SyntaxError{p.peek().line, fmt.Sprintf("blocks or expressions nested deeper than %d", MaxNesting)}
	}
	return nil
}

func (p *parser) unnest() { p.depth-- }

func (p *parser) peek() token { return p.toks[p.pos] }

func (p *parser) next() token {
	t := p.toks[p.pos]
	if t.kind != tEOF {
		p.pos++
	}
	return t
}

func (p *parser) errf(format string, args ...any) error {
	return &SyntaxError{p.peek().line, fmt.Sprintf(format, args...)}
}

func (p *parser) isOp(op string) bool {
	t := p.peek()
	return t.kind == tOp && t.val == op
}

func (p *parser) isName(name string) bool {
	t := p.peek()
	return t.kind == tName && t.val == name
}

func (p *parser) expectOp(op string) error {
	if !p.isOp(op) {
		return p.errf("expected %q, found %s", op, p.peek())
	}
	p.next()
	return nil
}

func (p *parser) expectName() (string, error) {
	t := p.peek()
	if t.kind != tName {
		return "", p.errf("expected a name, found %s", t)
	}
	p.next()
	return t.val, nil
}

func (p *parser) expectBlockEnd() error {
	if p.peek().kind != tBlockEnd {
		return p.errf("expected end of tag, found %s", p.peek())
	}
	p.next()
	return nil
}

// parseBody parses nodes until a block tag named in stops; it returns the nodes and
// the stop tag's name, leaving the parser after that name.
func (p *parser) parseBody(stops ...string) ([]node, string, error) {
	if err := p.nest(); err != nil {
		return nil, "", err
	}
	defer p.unnest()
	var out []node
	for {
		t := p.next()
		switch t.kind {
		case tEOF:
			if len(stops) > 0 {
				return nil, "", &SyntaxError{t.line, fmt.Sprintf("missing {%% %s %%}", stops[len(stops)-1])}
			}
			return out, "", nil
		case tText:
			out = append(out, textNode{t.val})
		case tVarBegin:
			e, err := p.parseExpr()
			if err != nil {
				return nil, "", err
			}
			if p.peek().kind != tVarEnd {
				return nil, "", p.errf("expected }}, found %s", p.peek())
			}
			p.next()
			out = append(out, outputNode{e, t.line})
		case tBlockBegin:
			name, err := p.expectName()
			if err != nil {
				return nil, "", err
			}
			for _, s := range stops {
				if name == s {
					return out, name, nil
				}
			}
			n, err := p.parseStatement(name, t.line)
			if err != nil {
				return nil, "", err
			}
			if n != nil {
				out = append(out, n)
			}
		default:
			return nil, "", &SyntaxError{t.line, fmt.Sprintf("unexpected %s", t)}
		}
	}
}

func (p *parser) parseStatement(name string, line int) (node, error) {
	switch name {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor(line)
	case "set":
		return p.parseSet(line)
	case "macro":
		return p.parseMacro()
	case "call":
		return p.parseCallBlock(line)
	case "filter":
		return p.parseFilterBlock(line)
	case "break", "continue":
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if name == "break" {
			return breakNode{}, nil
		}
		return continueNode{}, nil
	case "generation":
		// transformers' assistant-mask marker: renders its body unchanged.
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.parseBody("endgeneration")
		if err != nil {
			return nil, err
		}
		return &ifNode{conds: []expr{literal{true}}, bodies: [][]node{body}}, p.expectBlockEnd()
	}
	return nil, &SyntaxError{line, fmt.Sprintf("unknown tag %q", name)}
}

func (p *parser) parseIf() (node, error) {
	n := &ifNode{}
	for {
		cond, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, stop, err := p.parseBody("elif", "else", "endif")
		if err != nil {
			return nil, err
		}
		n.conds, n.bodies = append(n.conds, cond), append(n.bodies, body)
		switch stop {
		case "elif":
			continue
		case "else":
			if err := p.expectBlockEnd(); err != nil {
				return nil, err
			}
			if n.els, _, err = p.parseBody("endif"); err != nil {
				return nil, err
			}
		}
		return n, p.expectBlockEnd()
	}
}

func (p *parser) parseFor(line int) (node, error) {
	n := &forNode{line: line}
	for {
		v, err := p.expectName()
		if err != nil {
			return nil, err
		}
		n.vars = append(n.vars, v)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if !p.isName("in") {
		return nil, p.errf("expected 'in' in for loop, found %s", p.peek())
	}
	p.next()
	iter, err := p.parseOr() // no conditional expression: "if" filters the loop
	if err != nil {
		return nil, err
	}
	n.iter = iter
	if p.isName("if") {
		p.next()
		if n.cond, err = p.parseOr(); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		p.next()
		n.recursed = true
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, stop, err := p.parseBody("else", "endfor")
	if err != nil {
		return nil, err
	}
	n.body = body
	if stop == "else" {
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if n.els, _, err = p.parseBody("endfor"); err != nil {
			return nil, err
		}
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseSet(line int) (node, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	n := &setNode{name: name, line: line}
	if p.isOp(".") {
		p.next()
		if n.attr, err = p.expectName(); err != nil {
			return nil, err
		}
	}
	if p.isOp(",") {
		return nil, p.errf("tuple assignment in set is not supported")
	}
	if p.peek().kind == tBlockEnd {
		p.next()
		if n.body, _, err = p.parseBody("endset"); err != nil {
			return nil, err
		}
		return n, p.expectBlockEnd()
	}
	if err := p.expectOp("="); err != nil {
		return nil, err
	}
	if n.e, err = p.parseExpr(); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseMacro() (node, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	n := &macroNode{name: name}
	if err := p.expectOp("("); err != nil {
		return nil, err
	}
	for !p.isOp(")") {
		pn, err := p.expectName()
		if err != nil {
			return nil, err
		}
		prm := param{name: pn}
		if p.isOp("=") {
			p.next()
			if prm.def, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		n.params = append(n.params, prm)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if err := p.expectOp(")"); err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if n.body, _, err = p.parseBody("endmacro"); err != nil {
		return nil, err
	}
	return n, p.expectBlockEnd()
}

func (p *parser) parseCallBlock(line int) (node, error) {
	call, err := p.parsePostfix()
	if err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.parseBody("endcall")
	if err != nil {
		return nil, err
	}
	return &callBlockNode{call: call, body: body, line: line}, p.expectBlockEnd()
}

func (p *parser) parseFilterBlock(line int) (node, error) {
	f, err := p.parseFilter(literal{""}, line)
	if err != nil {
		return nil, err
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.parseBody("endfilter")
	if err != nil {
		return nil, err
	}
	return &filterBlockNode{filter: f, body: body}, p.expectBlockEnd()
}

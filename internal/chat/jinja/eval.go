package jinja

import (
	"errors"
	"fmt"
	"strings"
)

// Template is a parsed template. Render is safe for concurrent use.
type Template struct {
	body []node
}

// Parse parses a template.
func Parse(src string) (*Template, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	body, _, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	return &Template{body: body}, nil
}

// RaisedError is an error the template raised itself (raise_exception): the input did
// not suit the template, e.g. roles that do not alternate.
type RaisedError struct{ Message string }

func (e *RaisedError) Error() string { return e.Message }

// RenderError is a failure while rendering, with the template line.
type RenderError struct {
	Line int
	Err  error
}

func (e *RenderError) Error() string {
	return fmt.Sprintf("template error at line %d: %v", e.Line, e.Err)
}

func (e *RenderError) Unwrap() error { return e.Err }

// Render renders the template with vars (converted with FromGo unless they are
// template values already).
func (t *Template) Render(vars map[string]any) (out string, err error) {
	return t.render(vars, maxSteps, MaxWork)
}

// render is Render within steps steps and work units of work.
func (t *Template) render(vars map[string]any, steps int, work int64) (out string, err error) {
	defer func() {
		if v := recover(); v != nil {
			if le, ok := v.(*LimitError); ok {
				out, err = "", le
				return
			}
			out, err = "", fmt.Errorf("template rendering failed: %v", v)
		}
	}()
	globals := builtinGlobals()
	for k, v := range vars {
		globals[k] = FromGo(v)
	}
	r := &renderer{b: &budget{maxSteps: steps, maxWork: work}}
	sc := &scope{vars: globals}
	if err := r.exec(t.body, sc); err != nil {
		var ctl loopControl
		if errors.As(err, &ctl) {
			return "", fmt.Errorf("%s outside a loop", ctl)
		}
		return "", err
	}
	return r.out.String(), nil
}

type renderer struct {
	out strings.Builder
	b   *budget
}

type scope struct {
	vars   map[string]any
	parent *scope
}

func (s *scope) lookup(name string) (any, bool) {
	for c := s; c != nil; c = c.parent {
		if v, ok := c.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

func (s *scope) child() *scope { return &scope{vars: map[string]any{}, parent: s} }

type loopControl string

func (l loopControl) Error() string { return string(l) }

const (
	errBreak    loopControl = "break"
	errContinue loopControl = "continue"
)

func (r *renderer) step() error {
	r.b.steps++
	if r.b.steps > r.b.maxSteps {
		return &LimitError{Limit: "steps", Size: int64(r.b.steps), Max: int64(r.b.maxSteps)}
	}
	if r.out.Len() > maxOutput {
		return &LimitError{Limit: "output size", Size: int64(r.out.Len()), Max: maxOutput}
	}
	return nil
}

// write writes what a template outputs, counting its work.
func (r *renderer) write(s string, line int) error {
	if err := r.work(weight(s)); err != nil {
		return wrapLine(err, line)
	}
	r.out.WriteString(s)
	return nil
}

func (r *renderer) exec(body []node, sc *scope) error {
	if err := r.enter(); err != nil {
		return err
	}
	defer r.leave()
	for _, n := range body {
		if err := r.step(); err != nil {
			return err
		}
		if err := r.execNode(n, sc); err != nil {
			return err
		}
	}
	return nil
}

func (r *renderer) execNode(n node, sc *scope) error {
	switch n := n.(type) {
	case textNode:
		r.out.WriteString(n.s)
	case outputNode:
		v, err := r.eval(n.e, sc)
		if err != nil {
			return wrapLine(err, n.line)
		}
		return r.write(toStr(v), n.line)
	case *ifNode:
		return r.execIf(n, sc)
	case *forNode:
		return r.execFor(n, sc)
	case *setNode:
		return r.execSet(n, sc)
	case *macroNode:
		sc.vars[n.name] = r.makeMacro(n, sc)
	case *callBlockNode:
		return r.execCallBlock(n, sc)
	case *filterBlockNode:
		return r.execFilterBlock(n, sc)
	case breakNode:
		return errBreak
	case continueNode:
		return errContinue
	default:
		return fmt.Errorf("unknown node %T", n)
	}
	return nil
}

// execIf renders the body of the first true condition, or the else body.
func (r *renderer) execIf(n *ifNode, sc *scope) error {
	for i, c := range n.conds {
		v, err := r.eval(c, sc)
		if err != nil {
			return err
		}
		if truthy(v) {
			return r.exec(n.bodies[i], sc)
		}
	}
	return r.exec(n.els, sc)
}

// execSet assigns a variable, or an attribute of a namespace(), from an expression or
// from a rendered block.
func (r *renderer) execSet(n *setNode, sc *scope) error {
	var v any
	if n.body != nil {
		sub := &renderer{b: r.b}
		if err := sub.exec(n.body, sc); err != nil {
			return err
		}
		v = sub.out.String()
		if err := r.produced(v); err != nil {
			return wrapLine(err, n.line)
		}
	} else {
		var err error
		if v, err = r.eval(n.e, sc); err != nil {
			return wrapLine(err, n.line)
		}
	}
	if n.attr == "" {
		sc.vars[n.name] = v
		return nil
	}
	obj, _ := sc.lookup(n.name)
	d, ok := obj.(*Dict)
	if !ok || !d.namespace {
		return &RenderError{n.line, fmt.Errorf("cannot set attribute %q of %s: only a namespace() can be assigned to", n.attr, n.name)}
	}
	d.Set(n.attr, v)
	return nil
}

// execCallBlock renders a {% call %} block: the called macro sees the block's body as
// caller().
func (r *renderer) execCallBlock(n *callBlockNode, sc *scope) error {
	caller := Func(func([]any, *Dict) (any, error) {
		return r.call(func() (any, error) {
			sub := &renderer{b: r.b}
			err := sub.exec(n.body, sc.child())
			return sub.out.String(), err
		})
	})
	inner := sc.child()
	inner.vars["caller"] = caller
	v, err := r.eval(n.call, inner)
	if err != nil {
		return wrapLine(err, n.line)
	}
	return r.write(toStr(v), n.line)
}

// execFilterBlock renders a {% filter %} block's body and writes it through the filter.
func (r *renderer) execFilterBlock(n *filterBlockNode, sc *scope) error {
	sub := &renderer{b: r.b}
	if err := sub.exec(n.body, sc); err != nil {
		return err
	}
	f := *n.filter
	f.e = literal{sub.out.String()}
	v, err := r.eval(&f, sc)
	if err != nil {
		return err
	}
	return r.write(toStr(v), n.filter.line)
}

func wrapLine(err error, line int) error {
	var re *RenderError
	var raised *RaisedError
	if errors.As(err, &re) || errors.As(err, &raised) {
		return err
	}
	var ctl loopControl
	if errors.As(err, &ctl) {
		return err
	}
	return &RenderError{Line: line, Err: err}
}

func (r *renderer) execFor(n *forNode, sc *scope) error {
	iv, err := r.eval(n.iter, sc)
	if err != nil {
		return wrapLine(err, n.line)
	}
	items, err := iterate(iv)
	if err == nil {
		err = r.work(weight(iv))
	}
	if err != nil {
		return &RenderError{n.line, err}
	}
	// Filtered loops count only the items that pass.
	inner := sc.child()
	if n.cond != nil {
		kept := items[:0:0]
		for _, it := range items {
			if err := bindLoopVars(inner, n.vars, it, n.line); err != nil {
				return err
			}
			c, err := r.eval(n.cond, inner)
			if err != nil {
				return wrapLine(err, n.line)
			}
			if truthy(c) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		return r.exec(n.els, sc)
	}
	for i, it := range items {
		if err := r.step(); err != nil {
			return err
		}
		inner := sc.child()
		if err := bindLoopVars(inner, n.vars, it, n.line); err != nil {
			return err
		}
		inner.vars["loop"] = loopObject(items, i)
		err := r.exec(n.body, inner)
		switch {
		case errors.Is(err, errBreak):
			return nil
		case errors.Is(err, errContinue):
		case err != nil:
			return err
		}
	}
	return nil
}

func bindLoopVars(sc *scope, vars []string, item any, line int) error {
	if len(vars) == 1 {
		sc.vars[vars[0]] = item
		return nil
	}
	l, ok := item.(*List)
	if !ok || len(l.Items) != len(vars) {
		return &RenderError{line, fmt.Errorf("cannot unpack %s into %d names", typeName(item), len(vars))}
	}
	for i, name := range vars {
		sc.vars[name] = l.Items[i]
	}
	return nil
}

func loopObject(items []any, i int) *Dict {
	d := NewDict()
	n := len(items)
	d.Set("index", int64(i+1))
	d.Set("index0", int64(i))
	d.Set("revindex", int64(n-i))
	d.Set("revindex0", int64(n-i-1))
	d.Set("first", i == 0)
	d.Set("last", i == n-1)
	d.Set("length", int64(n))
	if i > 0 {
		d.Set("previtem", items[i-1])
	} else {
		d.Set("previtem", Undefined{"previtem"})
	}
	if i < n-1 {
		d.Set("nextitem", items[i+1])
	} else {
		d.Set("nextitem", Undefined{"nextitem"})
	}
	d.Set("cycle", Func(func(args []any, _ *Dict) (any, error) {
		if len(args) == 0 {
			return nil, errors.New("loop.cycle needs at least one value")
		}
		return args[i%len(args)], nil
	}))
	return d
}

func (r *renderer) makeMacro(n *macroNode, sc *scope) Func {
	return func(args []any, kwargs *Dict) (any, error) {
		inner := sc.child()
		if len(args) > len(n.params) {
			return nil, fmt.Errorf("macro %s takes %d arguments, got %d", n.name, len(n.params), len(args))
		}
		for i, prm := range n.params {
			var v any = Undefined{prm.name}
			switch {
			case i < len(args):
				v = args[i]
			case prm.def != nil:
				d, err := r.eval(prm.def, sc)
				if err != nil {
					return nil, err
				}
				v = d
			}
			if kwargs != nil {
				if kv, ok := kwargs.Get(prm.name); ok {
					v = kv
				}
			}
			inner.vars[prm.name] = v
		}
		return r.call(func() (any, error) {
			sub := &renderer{b: r.b}
			if err := sub.exec(n.body, inner); err != nil {
				return nil, err
			}
			return sub.out.String(), nil
		})
	}
}

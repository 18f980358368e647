package jinja

import (
	"errors"
	"fmt"
	"math"
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

// maxOutput bounds a rendering (a template looping on itself must not eat the memory).
const maxOutput = 64 << 20

// maxSteps bounds the statements and loop iterations of one rendering.
const maxSteps = 1_000_000

// Render renders the template with vars (converted with FromGo unless they are
// template values already).
func (t *Template) Render(vars map[string]any) (out string, err error) {
	defer func() {
		if v := recover(); v != nil {
			out, err = "", fmt.Errorf("template rendering failed: %v", v)
		}
	}()
	globals := builtinGlobals()
	for k, v := range vars {
		globals[k] = FromGo(v)
	}
	r := &renderer{}
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
	out   strings.Builder
	steps int
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
	r.steps++
	if r.steps > maxSteps {
		return errors.New("the template ran too long")
	}
	if r.out.Len() > maxOutput {
		return errors.New("the template's output is too large")
	}
	return nil
}

func (r *renderer) exec(body []node, sc *scope) error {
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
		r.out.WriteString(toStr(v))
	case *ifNode:
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
	case *forNode:
		return r.execFor(n, sc)
	case *setNode:
		var v any
		if n.body != nil {
			sub := &renderer{steps: r.steps}
			if err := sub.exec(n.body, sc); err != nil {
				return err
			}
			r.steps = sub.steps
			v = sub.out.String()
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
	case *macroNode:
		sc.vars[n.name] = r.makeMacro(n, sc)
	case *callBlockNode:
		caller := Func(func([]any, *Dict) (any, error) {
			sub := &renderer{steps: r.steps}
			err := sub.exec(n.body, sc.child())
			r.steps = sub.steps
			return sub.out.String(), err
		})
		inner := sc.child()
		inner.vars["caller"] = caller
		v, err := r.eval(n.call, inner)
		if err != nil {
			return wrapLine(err, n.line)
		}
		r.out.WriteString(toStr(v))
	case *filterBlockNode:
		sub := &renderer{steps: r.steps}
		if err := sub.exec(n.body, sc); err != nil {
			return err
		}
		r.steps = sub.steps
		f := *n.filter
		f.e = literal{sub.out.String()}
		v, err := r.eval(&f, sc)
		if err != nil {
			return err
		}
		r.out.WriteString(toStr(v))
	case breakNode:
		return errBreak
	case continueNode:
		return errContinue
	default:
		return fmt.Errorf("unknown node %T", n)
	}
	return nil
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
		sub := &renderer{steps: r.steps}
		if err := sub.exec(n.body, inner); err != nil {
			return nil, err
		}
		r.steps = sub.steps
		return sub.out.String(), nil
	}
}

func (r *renderer) eval(e expr, sc *scope) (any, error) {
	switch e := e.(type) {
	case literal:
		return e.v, nil
	case nameExpr:
		if v, ok := sc.lookup(e.name); ok {
			return v, nil
		}
		return Undefined{e.name}, nil
	case listExpr:
		l := &List{Items: make([]any, len(e.items))}
		for i, x := range e.items {
			v, err := r.eval(x, sc)
			if err != nil {
				return nil, err
			}
			l.Items[i] = v
		}
		return l, nil
	case dictExpr:
		d := NewDict()
		for i := range e.keys {
			k, err := r.eval(e.keys[i], sc)
			if err != nil {
				return nil, err
			}
			v, err := r.eval(e.vals[i], sc)
			if err != nil {
				return nil, err
			}
			d.Set(toStr(k), v)
		}
		return d, nil
	case attrExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		return getAttr(obj, e.name), nil
	case itemExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		key, err := r.eval(e.key, sc)
		if err != nil {
			return nil, err
		}
		return getItem(obj, key)
	case sliceExpr:
		return r.evalSlice(e, sc)
	case callExpr:
		return r.evalCall(e, sc)
	case *filterExpr:
		return r.evalFilter(e, sc)
	case *testExpr:
		return r.evalTest(e, sc)
	case unaryExpr:
		x, err := r.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		switch e.op {
		case "not":
			return !truthy(x), nil
		case "-":
			switch x := x.(type) {
			case int64:
				return -x, nil
			case float64:
				return -x, nil
			}
			return nil, fmt.Errorf("bad operand type for unary -: %s", typeName(x))
		}
		return x, nil
	case binaryExpr:
		return r.evalBinary(e, sc)
	case condExpr:
		c, err := r.eval(e.cond, sc)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return r.eval(e.then, sc)
		}
		return r.eval(e.els, sc)
	}
	return nil, fmt.Errorf("unknown expression %T", e)
}

// getAttr is obj.name: a dict key, else a method of the value, else undefined.
func getAttr(obj any, name string) any {
	if d, ok := obj.(*Dict); ok {
		if v, ok := d.Get(name); ok {
			return v
		}
	}
	if m := method(obj, name); m != nil {
		return m
	}
	return Undefined{name}
}

func getItem(obj, key any) (any, error) {
	switch o := obj.(type) {
	case *Dict:
		if v, ok := o.Get(toStr(key)); ok {
			return v, nil
		}
		if s, ok := key.(string); ok {
			if m := method(obj, s); m != nil {
				return m, nil
			}
		}
		return Undefined{toStr(key)}, nil
	case *List:
		i, ok := key.(int64)
		if !ok {
			return nil, fmt.Errorf("list indices must be integers, not %s", typeName(key))
		}
		if i < 0 {
			i += int64(len(o.Items))
		}
		if i < 0 || i >= int64(len(o.Items)) {
			return Undefined{}, nil
		}
		return o.Items[i], nil
	case string:
		i, ok := key.(int64)
		if !ok {
			return nil, fmt.Errorf("string indices must be integers, not %s", typeName(key))
		}
		rs := []rune(o)
		if i < 0 {
			i += int64(len(rs))
		}
		if i < 0 || i >= int64(len(rs)) {
			return Undefined{}, nil
		}
		return string(rs[i]), nil
	case Undefined, nil:
		return Undefined{toStr(key)}, nil
	}
	return nil, fmt.Errorf("%s object is not subscriptable", typeName(obj))
}

func (r *renderer) evalSlice(e sliceExpr, sc *scope) (any, error) {
	obj, err := r.eval(e.obj, sc)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, x := range []expr{e.start, e.stop, e.step} {
		if x == nil {
			continue
		}
		v, err := r.eval(x, sc)
		if err != nil {
			return nil, err
		}
		switch v := v.(type) {
		case int64:
			bounds[i] = &v
		case nil:
		default:
			return nil, fmt.Errorf("slice indices must be integers, not %s", typeName(v))
		}
	}
	var items []any
	isStr := false
	switch o := obj.(type) {
	case *List:
		items = o.Items
	case string:
		isStr = true
		for _, c := range o {
			items = append(items, string(c))
		}
	case Undefined, nil:
		return Undefined{}, nil
	default:
		return nil, fmt.Errorf("%s object cannot be sliced", typeName(obj))
	}
	idx := sliceIndices(len(items), bounds)
	if idx == nil {
		return nil, errors.New("slice step cannot be zero")
	}
	if isStr {
		var sb strings.Builder
		for _, i := range idx {
			sb.WriteString(items[i].(string))
		}
		return sb.String(), nil
	}
	out := &List{Items: make([]any, 0, len(idx))}
	for _, i := range idx {
		out.Items = append(out.Items, items[i])
	}
	return out, nil
}

// sliceIndices follows Python's slice semantics; nil means a zero step.
func sliceIndices(n int, b [3]*int64) []int {
	step := int64(1)
	if b[2] != nil {
		step = *b[2]
	}
	if step == 0 {
		return nil
	}
	clamp := func(p *int64, def int64) int64 {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += int64(n)
		}
		if step > 0 {
			return max(0, min(v, int64(n)))
		}
		return max(-1, min(v, int64(n)-1))
	}
	out := []int{}
	if step > 0 {
		for i := clamp(b[0], 0); i < clamp(b[1], int64(n)); i += step {
			out = append(out, int(i))
		}
	} else {
		for i := clamp(b[0], int64(n)-1); i > clamp(b[1], -1); i += step {
			out = append(out, int(i))
		}
	}
	return out
}

func (r *renderer) evalArgs(args []expr, kwargs []kwarg, sc *scope) ([]any, *Dict, error) {
	vals := make([]any, len(args))
	for i, a := range args {
		v, err := r.eval(a, sc)
		if err != nil {
			return nil, nil, err
		}
		vals[i] = v
	}
	var kw *Dict
	if len(kwargs) > 0 {
		kw = NewDict()
		for _, k := range kwargs {
			v, err := r.eval(k.e, sc)
			if err != nil {
				return nil, nil, err
			}
			kw.Set(k.name, v)
		}
	}
	return vals, kw, nil
}

func (r *renderer) evalCall(e callExpr, sc *scope) (any, error) {
	fn, err := r.eval(e.fn, sc)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(e.args, e.kwargs, sc)
	if err != nil {
		return nil, err
	}
	f, ok := fn.(Func)
	if !ok {
		name := ""
		switch x := e.fn.(type) {
		case nameExpr:
			name = x.name
		case attrExpr:
			name = x.name
		}
		if _, undef := fn.(Undefined); undef {
			return nil, &RenderError{e.line, fmt.Errorf("%q is undefined and cannot be called", name)}
		}
		return nil, &RenderError{e.line, fmt.Errorf("%s object %q is not callable", typeName(fn), name)}
	}
	v, err := f(args, kw)
	if err != nil {
		return nil, wrapLine(err, e.line)
	}
	return v, nil
}

func (r *renderer) evalBinary(e binaryExpr, sc *scope) (any, error) {
	l, err := r.eval(e.l, sc)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	}
	rv, err := r.eval(e.r, sc)
	if err != nil {
		return nil, err
	}
	v, err := binaryOp(e.op, l, rv)
	if err != nil {
		return nil, &RenderError{e.line, err}
	}
	return v, nil
}

func binaryOp(op string, l, r any) (any, error) {
	switch op {
	case "==":
		return equal(l, r), nil
	case "!=":
		return !equal(l, r), nil
	case "<", ">", "<=", ">=":
		c, err := compare(l, r)
		if err != nil {
			return nil, err
		}
		return map[string]bool{"<": c < 0, ">": c > 0, "<=": c <= 0, ">=": c >= 0}[op], nil
	case "in", "not in":
		in, err := contains(r, l)
		if err != nil {
			return nil, err
		}
		return in == (op == "in"), nil
	case "~":
		return toStr(l) + toStr(r), nil
	case "+":
		switch lv := l.(type) {
		case string:
			if rs, ok := r.(string); ok {
				return lv + rs, nil
			}
		case *List:
			if rl, ok := r.(*List); ok {
				out := &List{Items: append(append([]any{}, lv.Items...), rl.Items...)}
				return out, nil
			}
		}
	case "*":
		if s, ok := l.(string); ok {
			if n, ok := r.(int64); ok {
				return strings.Repeat(s, int(max(0, min(n, 1<<20)))), nil
			}
		}
	}
	return arith(op, l, r)
}

func arith(op string, l, r any) (any, error) {
	li, lInt := l.(int64)
	ri, rInt := r.(int64)
	if lb, ok := l.(bool); ok {
		li, lInt = map[bool]int64{true: 1, false: 0}[lb], true
	}
	if rb, ok := r.(bool); ok {
		ri, rInt = map[bool]int64{true: 1, false: 0}[rb], true
	}
	lf, lok := number(l)
	rf, rok := number(r)
	if !lok || !rok {
		return nil, fmt.Errorf("unsupported operand types for %s: %s and %s", op, typeName(l), typeName(r))
	}
	if lInt && rInt {
		switch op {
		case "+":
			return li + ri, nil
		case "-":
			return li - ri, nil
		case "*":
			return li * ri, nil
		case "//":
			if ri == 0 {
				return nil, errors.New("integer division by zero")
			}
			q := li / ri
			if (li%ri != 0) && ((li < 0) != (ri < 0)) {
				q--
			}
			return q, nil
		case "%":
			if ri == 0 {
				return nil, errors.New("integer modulo by zero")
			}
			m := li % ri
			if m != 0 && (m < 0) != (ri < 0) {
				m += ri
			}
			return m, nil
		case "**":
			if ri >= 0 {
				return int64(math.Pow(float64(li), float64(ri))), nil
			}
		}
	}
	switch op {
	case "+":
		return lf + rf, nil
	case "-":
		return lf - rf, nil
	case "*":
		return lf * rf, nil
	case "/":
		if rf == 0 {
			return nil, errors.New("division by zero")
		}
		return lf / rf, nil
	case "//":
		if rf == 0 {
			return nil, errors.New("division by zero")
		}
		return math.Floor(lf / rf), nil
	case "%":
		if rf == 0 {
			return nil, errors.New("modulo by zero")
		}
		return lf - rf*math.Floor(lf/rf), nil
	case "**":
		return math.Pow(lf, rf), nil
	}
	return nil, fmt.Errorf("unknown operator %s", op)
}

// contains is Python's "needle in haystack".
func contains(haystack, needle any) (bool, error) {
	switch h := haystack.(type) {
	case string:
		n, ok := needle.(string)
		if !ok {
			return false, fmt.Errorf("'in <string>' requires a string as left operand, not %s", typeName(needle))
		}
		return strings.Contains(h, n), nil
	case *List:
		for _, x := range h.Items {
			if equal(x, needle) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		s, ok := needle.(string)
		if !ok {
			return false, nil
		}
		_, in := h.Get(s)
		return in, nil
	case Undefined, nil:
		return false, nil
	}
	return false, fmt.Errorf("argument of type %s is not iterable", typeName(haystack))
}

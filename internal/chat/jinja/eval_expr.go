package jinja

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

func (r *renderer) eval(e expr, sc *scope) (any, error) {
	if err := r.enter(); err != nil {
		return nil, err
	}
	defer r.leave()
	switch e := e.(type) {
	case literal:
		return e.v, nil
	case nameExpr:
		if v, ok := sc.lookup(e.name); ok {
			return v, nil
		}
		return Undefined{e.name}, nil
	case listExpr:
		return r.evalList(e, sc)
	case dictExpr:
		return r.evalDict(e, sc)
	case attrExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		return r.attr(obj, e.name)
	case itemExpr:
		return r.evalItem(e, sc)
	case sliceExpr:
		return r.evalSlice(e, sc)
	case callExpr:
		return r.evalCall(e, sc)
	case *filterExpr:
		return r.evalFilter(e, sc)
	case *testExpr:
		return r.evalTest(e, sc)
	case unaryExpr:
		return r.evalUnary(e, sc)
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

// evalList evaluates a list literal, item by item.
func (r *renderer) evalList(e listExpr, sc *scope) (any, error) {
	l := &List{Items: make([]any, len(e.items))}
	for i, x := range e.items {
		v, err := r.eval(x, sc)
		if err != nil {
			return nil, err
		}
		l.Items[i] = v
	}
	return l, nil
}

// evalDict evaluates a dict literal, key then value for each entry, in order.
func (r *renderer) evalDict(e dictExpr, sc *scope) (any, error) {
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
}

// evalItem evaluates obj[key]: a character of a string, or an item of anything else.
func (r *renderer) evalItem(e itemExpr, sc *scope) (any, error) {
	obj, err := r.eval(e.obj, sc)
	if err != nil {
		return nil, err
	}
	key, err := r.eval(e.key, sc)
	if err != nil {
		return nil, err
	}
	if s, ok := obj.(string); ok {
		return r.indexString(s, key)
	}
	if err := r.work(1); err != nil {
		return nil, err
	}
	return getItem(obj, key)
}

// evalUnary evaluates "not x", "-x" and "+x".
func (r *renderer) evalUnary(e unaryExpr, sc *scope) (any, error) {
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
}

// attr is getAttr, counting the work of a method it returns.
func (r *renderer) attr(obj any, name string) (any, error) {
	v := getAttr(obj, name)
	if _, ok := v.(Func); ok {
		if d, ok := obj.(*Dict); !ok || d.m[name] == nil {
			return v, r.work(r.methodWork(obj, name))
		}
	}
	return v, nil
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

// getItem is obj[key] of anything but a string (indexString).
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
	var n int
	var str *strIndex
	switch o := obj.(type) {
	case *List:
		n = len(o.Items)
	case string:
		if str, err = r.runes(o); err != nil {
			return nil, err
		}
		n = str.runes
	case Undefined, nil:
		return Undefined{}, nil
	default:
		return nil, fmt.Errorf("%s object cannot be sliced", typeName(obj))
	}
	sl, ok := sliceOf(n, bounds)
	if !ok {
		return nil, errors.New("slice step cannot be zero")
	}
	if str != nil {
		if sl.step == 1 { // a substring, the same bytes
			return str.s[str.offset(sl.start):str.offset(sl.start+sl.count)], nil
		}
		// the runes it walks, up to 4 bytes each, each decoded (and every step-th
		// written out again): a rune walked costs what 16 bytes compared do
		if err := r.work(satMul(16*int64(sl.count), int64(max(sl.step, -sl.step)))); err != nil {
			return nil, err
		}
		return str.sliceString(sl), nil
	}
	if err := r.work(itemWeight * int64(sl.count)); err != nil {
		return nil, err
	}
	items := obj.(*List).Items
	out := &List{Items: make([]any, sl.count)}
	for k := range sl.count {
		out.Items[k] = items[sl.start+k*sl.step]
	}
	return out, nil
}

// slice is the indices start, start+step, ... of count items.
type slice struct{ start, step, count int }

// sliceOf follows Python's slice semantics on a sequence of n items; false means a
// zero step.
func sliceOf(n int, b [3]*int64) (slice, bool) {
	step := int64(1)
	if b[2] != nil {
		step = *b[2]
	}
	if step == 0 {
		return slice{}, false
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
	var start, stop int64
	if step > 0 {
		start, stop = clamp(b[0], 0), clamp(b[1], int64(n))
	} else {
		start, stop = clamp(b[0], int64(n)-1), clamp(b[1], -1)
	}
	count := int64(0)
	switch {
	case step > 0 && stop > start:
		count = (stop - start + step - 1) / step
	case step < 0 && stop < start:
		count = (start - stop - step - 1) / -step
	}
	return slice{start: int(start), step: int(step), count: int(count)}, true
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
	w := int64(0)
	for _, a := range args {
		w = satAdd(w, weight(a))
	}
	if err := r.work(w); err != nil {
		return nil, wrapLine(err, e.line)
	}
	v, err := f(args, kw)
	if err == nil {
		err = r.produced(v)
	}
	if err == nil {
		err = r.work(weight(v))
	}
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
	if err := r.work(r.operandsWeight(e.op, l, rv)); err != nil {
		return nil, &RenderError{e.line, err}
	}
	v, err := binaryOp(e.op, l, rv)
	if err == nil {
		err = r.produced(v)
	}
	if err == nil {
		err = r.work(weight(v))
	}
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
		ls, rs := toStr(l), toStr(r)
		if err := fitString(int64(len(ls)) + int64(len(rs))); err != nil {
			return nil, err
		}
		return ls + rs, nil
	case "+":
		switch lv := l.(type) {
		case string:
			if rs, ok := r.(string); ok {
				if err := fitString(int64(len(lv)) + int64(len(rs))); err != nil {
					return nil, err
				}
				return lv + rs, nil
			}
		case *List:
			if rl, ok := r.(*List); ok {
				if err := fitList(int64(len(lv.Items)) + int64(len(rl.Items))); err != nil {
					return nil, err
				}
				out := &List{Items: append(append([]any{}, lv.Items...), rl.Items...)}
				return out, nil
			}
		}
	case "*":
		if s, ok := l.(string); ok {
			if n, ok := r.(int64); ok {
				n = max(0, n)
				if n > 0 && int64(len(s)) > MaxValueBytes/n {
					return nil, &LimitError{Limit: "string size", Size: sizeTimes(int64(len(s)), n), Max: MaxValueBytes}
				}
				return strings.Repeat(s, int(n)), nil
			}
		}
	}
	return arith(op, l, r)
}

// sizeTimes is a*b, saturating at the largest int64.
func sizeTimes(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
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

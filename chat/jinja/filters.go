package jinja

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

func (r *renderer) evalFilter(f *filterExpr, sc *scope) (any, error) {
	v, err := r.eval(f.e, sc)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(f.args, f.kwargs, sc)
	if err != nil {
		return nil, err
	}
	var out any
	if s, ok := v.(string); ok && (f.name == "length" || f.name == "count") {
		var x *strIndex
		if x, err = r.runes(s); err == nil {
			out = int64(x.runes)
		}
	} else if err = r.work(r.filterWork(f.name, v, args, kw)); err == nil {
		out, err = applyFilter(f.name, v, args, kw)
		if err == nil {
			err = r.produced(out)
		}
		if err == nil {
			err = r.work(weightItems(out))
		}
	}
	if err != nil {
		return nil, wrapLine(fmt.Errorf("filter %s: %w", f.name, err), f.line)
	}
	return out, nil
}

// arg returns positional argument i, else keyword name, else def.
func arg(args []any, kw *Dict, i int, name string, def any) any {
	if i >= 0 && i < len(args) {
		return args[i]
	}
	if kw != nil {
		if v, ok := kw.Get(name); ok {
			return v
		}
	}
	return def
}

func applyFilter(name string, v any, args []any, kw *Dict) (any, error) {
	switch name {
	case "tojson":
		indent := 0
		if n, ok := arg(args, kw, 0, "indent", nil).(int64); ok {
			indent = int(n)
		}
		sep, kvsep := ", ", ": "
		if indent > 0 {
			sep = ","
		}
		if seps, ok := arg(args, kw, -1, "separators", nil).(*List); ok && len(seps.Items) == 2 {
			sep, kvsep = toStr(seps.Items[0]), toStr(seps.Items[1])
		}
		var sb strings.Builder
		if err := toJSON(&sb, v, indent, 0, sep, kvsep); err != nil {
			return nil, err
		}
		return sb.String(), nil
	case "trim":
		if chars, ok := arg(args, kw, 0, "chars", nil).(string); ok {
			return strings.Trim(toStr(v), chars), nil
		}
		return strings.TrimSpace(toStr(v)), nil
	case "length", "count":
		return length(v)
	case "string":
		return toStr(v), nil
	case "safe", "e", "escape", "forceescape":
		if name == "safe" {
			return v, nil
		}
		return htmlEscape(toStr(v)), nil
	case "lower":
		return strings.ToLower(toStr(v)), nil
	case "upper":
		return strings.ToUpper(toStr(v)), nil
	case "capitalize":
		s := strings.ToLower(toStr(v))
		for i, c := range s {
			return string(unicode.ToUpper(c)) + s[i+len(string(c)):], nil
		}
		return s, nil
	case "title":
		return pyTitle(toStr(v)), nil
	case "default", "d":
		def := arg(args, kw, 0, "default_value", "")
		boolean := truthy(arg(args, kw, 1, "boolean", false))
		if _, undef := v.(Undefined); undef || (boolean && !truthy(v)) {
			return def, nil
		}
		return v, nil
	case "first", "last":
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return Undefined{}, nil
		}
		if name == "first" {
			return items[0], nil
		}
		return items[len(items)-1], nil
	case "join":
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		attr, _ := arg(args, kw, 1, "attribute", nil).(string)
		parts := make([]string, len(items))
		for i, it := range items {
			if attr != "" {
				it = getAttr(it, attr)
			}
			parts[i] = toStr(it)
		}
		return joinStrings(parts, toStr(arg(args, kw, 0, "d", "")))
	case "list":
		items, err := iterate(v)
		return &List{Items: append([]any{}, items...)}, err
	case "items":
		d, ok := v.(*Dict)
		if !ok {
			if _, undef := v.(Undefined); undef {
				return &List{}, nil
			}
			return nil, fmt.Errorf("items needs a dict, not %s", typeName(v))
		}
		return dictItems(d), nil
	case "dictsort":
		d, ok := v.(*Dict)
		if !ok {
			return nil, fmt.Errorf("dictsort needs a dict, not %s", typeName(v))
		}
		items := dictItems(d)
		sort.SliceStable(items.Items, func(i, j int) bool {
			return items.Items[i].(*List).Items[0].(string) < items.Items[j].(*List).Items[0].(string)
		})
		return items, nil
	case "reverse":
		switch x := v.(type) {
		case string:
			rs := []rune(x)
			for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
				rs[i], rs[j] = rs[j], rs[i]
			}
			return string(rs), nil
		}
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		out := &List{Items: make([]any, len(items))}
		for i, it := range items {
			out.Items[len(items)-1-i] = it
		}
		return out, nil
	case "sort":
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		out := &List{Items: append([]any{}, items...)}
		attr, _ := arg(args, kw, 2, "attribute", nil).(string)
		rev := truthy(arg(args, kw, 0, "reverse", false))
		var cmpErr error
		sort.SliceStable(out.Items, func(i, j int) bool {
			a, b := out.Items[i], out.Items[j]
			if attr != "" {
				a, b = getAttr(a, attr), getAttr(b, attr)
			}
			c, err := compare(a, b)
			if err != nil {
				cmpErr = err
			}
			if rev {
				return c > 0
			}
			return c < 0
		})
		return out, cmpErr
	case "unique":
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		out := &List{}
		for _, it := range items {
			dup := false
			for _, seen := range out.Items {
				if equal(seen, it) {
					dup = true
					break
				}
			}
			if !dup {
				out.Items = append(out.Items, it)
			}
		}
		return out, nil
	case "map":
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		out := &List{}
		if attr, ok := arg(nil, kw, 0, "attribute", nil).(string); ok {
			for _, it := range items {
				x := getAttr(it, attr)
				if _, undef := x.(Undefined); undef && kw != nil {
					if d, ok := kw.Get("default"); ok {
						x = d
					}
				}
				out.Items = append(out.Items, x)
			}
			return out, nil
		}
		if len(args) == 0 {
			return nil, errors.New("map needs a filter name or attribute=")
		}
		for _, it := range items {
			x, err := applyFilter(toStr(args[0]), it, args[1:], nil)
			if err != nil {
				return nil, err
			}
			out.Items = append(out.Items, x)
		}
		return out, nil
	case "select", "reject", "selectattr", "rejectattr":
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		byAttr := strings.HasSuffix(name, "attr")
		want := strings.HasPrefix(name, "select")
		rest := args
		attr := ""
		if byAttr {
			if len(args) == 0 {
				return nil, fmt.Errorf("%s needs an attribute name", name)
			}
			attr, rest = toStr(args[0]), args[1:]
		}
		out := &List{}
		for _, it := range items {
			x := it
			if byAttr {
				x = getAttr(it, attr)
			}
			ok := truthy(x)
			if len(rest) > 0 {
				if ok, err = applyTest(toStr(rest[0]), x, rest[1:]); err != nil {
					return nil, err
				}
			}
			if ok == want {
				out.Items = append(out.Items, it)
			}
		}
		return out, nil
	case "replace":
		s := toStr(v)
		n := -1
		if c, ok := arg(args, kw, 2, "count", nil).(int64); ok {
			n = int(c)
		}
		return replaceString(s, toStr(arg(args, kw, 0, "old", "")), toStr(arg(args, kw, 1, "new", "")), n)
	case "indent":
		width := "    "
		switch w := arg(args, kw, 0, "width", int64(4)).(type) {
		case int64:
			if err := fitString(w); err != nil {
				return nil, err
			}
			width = strings.Repeat(" ", int(max(w, 0)))
		case string:
			width = w
		}
		first := truthy(arg(args, kw, 1, "first", false))
		blank := truthy(arg(args, kw, 2, "blank", false))
		lines := strings.Split(toStr(v), "\n")
		if err := fitString(sizeTimes(int64(len(lines)), int64(len(width)))); err != nil {
			return nil, err
		}
		for i, l := range lines {
			if (i > 0 || first) && (blank || strings.TrimSpace(l) != "") {
				lines[i] = width + l
			}
		}
		return joinStrings(lines, "\n")
	case "int":
		switch x := v.(type) {
		case int64:
			return x, nil
		case float64:
			return int64(x), nil
		case bool:
			return map[bool]int64{true: 1, false: 0}[x], nil
		case string:
			if i, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64); err == nil {
				return i, nil
			}
			if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil {
				return int64(f), nil
			}
		}
		return arg(args, kw, 0, "default", int64(0)), nil
	case "float":
		if f, ok := number(v); ok {
			return f, nil
		}
		if s, ok := v.(string); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
				return f, nil
			}
		}
		return arg(args, kw, 0, "default", 0.0), nil
	case "abs":
		switch x := v.(type) {
		case int64:
			if x < 0 {
				return -x, nil
			}
			return x, nil
		case float64:
			return math.Abs(x), nil
		}
		return nil, fmt.Errorf("abs needs a number, not %s", typeName(v))
	case "round":
		f, ok := number(v)
		if !ok {
			return nil, fmt.Errorf("round needs a number, not %s", typeName(v))
		}
		prec, _ := arg(args, kw, 0, "precision", int64(0)).(int64)
		p := math.Pow(10, float64(prec))
		return math.RoundToEven(f*p) / p, nil
	case "sum":
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		var total any = arg(args, kw, 1, "start", int64(0))
		attr, _ := arg(args, kw, 0, "attribute", nil).(string)
		for _, it := range items {
			if attr != "" {
				it = getAttr(it, attr)
			}
			if total, err = arith("+", total, it); err != nil {
				return nil, err
			}
		}
		return total, nil
	case "min", "max":
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return Undefined{}, nil
		}
		best := items[0]
		for _, it := range items[1:] {
			c, err := compare(it, best)
			if err != nil {
				return nil, err
			}
			if (name == "min" && c < 0) || (name == "max" && c > 0) {
				best = it
			}
		}
		return best, nil
	case "wordcount":
		return int64(len(strings.Fields(toStr(v)))), nil
	case "batch":
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		n, _ := arg(args, kw, 0, "linecount", int64(1)).(int64)
		if n < 1 {
			return nil, errors.New("batch size must be positive")
		}
		out := &List{}
		for i := 0; i < len(items); i += int(n) {
			out.Items = append(out.Items, &List{Items: append([]any{}, items[i:min(len(items), i+int(n))]...)})
		}
		return out, nil
	case "attr":
		return getAttr(v, toStr(arg(args, kw, 0, "name", ""))), nil
	case "format":
		return pyFormat(toStr(v), args)
	}
	return nil, fmt.Errorf("unknown filter %q", name)
}

func dictItems(d *Dict) *List {
	out := &List{Items: make([]any, len(d.keys))}
	for i, k := range d.keys {
		out.Items[i] = &List{Items: []any{k, d.m[k]}}
	}
	return out
}

func length(v any) (any, error) {
	switch x := v.(type) {
	case string:
		return int64(len([]rune(x))), nil
	case *List:
		return int64(len(x.Items)), nil
	case *Dict:
		return int64(x.Len()), nil
	case Undefined:
		return int64(0), nil
	}
	return nil, fmt.Errorf("object of type %s has no length", typeName(v))
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "\"", "&#34;", "'", "&#39;").Replace(s)
}

func pyTitle(s string) string {
	var sb strings.Builder
	prev := false
	for _, c := range s {
		if unicode.IsLetter(c) {
			if prev {
				sb.WriteRune(unicode.ToLower(c))
			} else {
				sb.WriteRune(unicode.ToUpper(c))
			}
			prev = true
		} else {
			sb.WriteRune(c)
			prev = false
		}
	}
	return sb.String()
}

// pyFormat is printf-style "%s" formatting (the format filter).
func pyFormat(f string, args []any) (string, error) {
	var sb strings.Builder
	n := 0
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			sb.WriteByte(f[i])
			continue
		}
		i++
		if f[i] == '%' {
			sb.WriteByte('%')
			continue
		}
		if n >= len(args) {
			return "", errors.New("not enough arguments for format string")
		}
		switch f[i] {
		case 'd', 'i':
			fv, _ := number(args[n])
			fmt.Fprintf(&sb, "%d", int64(fv))
		case 'f':
			fv, _ := number(args[n])
			fmt.Fprintf(&sb, "%f", fv)
		case 'r':
			sb.WriteString(repr(args[n]))
		default:
			sb.WriteString(toStr(args[n]))
		}
		n++
	}
	return sb.String(), nil
}

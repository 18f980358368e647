package jinja

import (
	"errors"
	"fmt"
	"math"
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

// filterFunc is one filter: name is the name it was called by (several filters share
// a function), v the value piped into it.
type filterFunc func(name string, v any, args []any, kw *Dict) (any, error)

// filters maps each filter's name to its function; it is filled in init because the
// map and select filters call applyFilter and applyTest in turn.
var filters map[string]filterFunc

func init() {
	filters = map[string]filterFunc{
		"tojson":     filterToJSON,
		"trim":       filterTrim,
		"length":     func(_ string, v any, _ []any, _ *Dict) (any, error) { return length(v) },
		"string":     stringFilter(func(s string) string { return s }),
		"safe":       func(_ string, v any, _ []any, _ *Dict) (any, error) { return v, nil },
		"e":          stringFilter(htmlEscape),
		"lower":      stringFilter(strings.ToLower),
		"upper":      stringFilter(strings.ToUpper),
		"capitalize": stringFilter(capitalize),
		"title":      stringFilter(pyTitle),
		"default":    filterDefault,
		"first":      filterFirstLast,
		"join":       filterJoin,
		"list":       filterList,
		"items":      filterItems,
		"dictsort":   filterDictsort,
		"reverse":    filterReverse,
		"sort":       filterSort,
		"unique":     filterUnique,
		"map":        filterMap,
		"select":     filterSelect,
		"replace":    filterReplace,
		"indent":     filterIndent,
		"int":        filterInt,
		"float":      filterFloat,
		"abs":        filterAbs,
		"round":      filterRound,
		"sum":        filterSum,
		"min":        filterMinMax,
		"wordcount": func(_ string, v any, _ []any, _ *Dict) (any, error) {
			return int64(len(strings.Fields(toStr(v)))), nil
		},
		"batch": filterBatch,
		"attr": func(_ string, v any, args []any, kw *Dict) (any, error) {
			return getAttr(v, toStr(arg(args, kw, 0, "name", ""))), nil
		},
		"format": func(_ string, v any, args []any, _ *Dict) (any, error) { return pyFormat(toStr(v), args) },
	}
	for alias, name := range map[string]string{
		"count": "length", "escape": "e", "forceescape": "e", "d": "default", "last": "first",
		"reject": "select", "selectattr": "select", "rejectattr": "select", "max": "min",
	} {
		filters[alias] = filters[name]
	}
}

func applyFilter(name string, v any, args []any, kw *Dict) (any, error) {
	if f, ok := filters[name]; ok {
		return f(name, v, args, kw)
	}
	return nil, fmt.Errorf("unknown filter %q", name)
}

// stringFilter is a filter that maps the string form of its value through fn.
func stringFilter(fn func(string) string) filterFunc {
	return func(_ string, v any, _ []any, _ *Dict) (any, error) { return fn(toStr(v)), nil }
}

func filterToJSON(_ string, v any, args []any, kw *Dict) (any, error) {
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
}

func filterTrim(_ string, v any, args []any, kw *Dict) (any, error) {
	if chars, ok := arg(args, kw, 0, "chars", nil).(string); ok {
		return strings.Trim(toStr(v), chars), nil
	}
	return strings.TrimSpace(toStr(v)), nil
}

func capitalize(s string) string {
	s = strings.ToLower(s)
	for i, c := range s {
		return string(unicode.ToUpper(c)) + s[i+len(string(c)):]
	}
	return s
}

func filterDefault(_ string, v any, args []any, kw *Dict) (any, error) {
	def := arg(args, kw, 0, "default_value", "")
	boolean := truthy(arg(args, kw, 1, "boolean", false))
	if _, undef := v.(Undefined); undef || (boolean && !truthy(v)) {
		return def, nil
	}
	return v, nil
}

func filterReplace(_ string, v any, args []any, kw *Dict) (any, error) {
	s := toStr(v)
	n := -1
	if c, ok := arg(args, kw, 2, "count", nil).(int64); ok {
		n = int(c)
	}
	return replaceString(s, toStr(arg(args, kw, 0, "old", "")), toStr(arg(args, kw, 1, "new", "")), n)
}

func filterIndent(_ string, v any, args []any, kw *Dict) (any, error) {
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
}

func filterInt(_ string, v any, args []any, kw *Dict) (any, error) {
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
}

func filterFloat(_ string, v any, args []any, kw *Dict) (any, error) {
	if f, ok := number(v); ok {
		return f, nil
	}
	if s, ok := v.(string); ok {
		if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
			return f, nil
		}
	}
	return arg(args, kw, 0, "default", 0.0), nil
}

func filterAbs(_ string, v any, _ []any, _ *Dict) (any, error) {
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
}

func filterRound(_ string, v any, args []any, kw *Dict) (any, error) {
	f, ok := number(v)
	if !ok {
		return nil, fmt.Errorf("round needs a number, not %s", typeName(v))
	}
	prec, _ := arg(args, kw, 0, "precision", int64(0)).(int64)
	p := math.Pow(10, float64(prec))
	return math.RoundToEven(f*p) / p, nil
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

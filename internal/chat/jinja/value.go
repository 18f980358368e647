package jinja

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Values are nil (None), Undefined, bool, int64, float64, string, *List, *Dict and
// callables (*macro, Func).

// Undefined is a name or attribute that does not exist. It renders as nothing, is
// false, and iterates as empty, as in Jinja's default mode.
type Undefined struct{ Name string }

// List is a Python list.
type List struct{ Items []any }

// Dict is a Python dict that keeps its insertion order. Keys are strings.
type Dict struct {
	keys []string
	m    map[string]any
	// namespace marks the object namespace() returns: its attributes can be set.
	namespace bool
}

// NewDict returns an empty dict.
func NewDict() *Dict { return &Dict{m: map[string]any{}} }

// Set sets key to v, appending the key if it is new.
// merge sets the entries of src (when it is a dict), then those of kw, in their
// order (Python's dict.update).
func (d *Dict) merge(src any, kw *Dict) {
	for _, from := range []*Dict{asDict(src), kw} {
		if from == nil {
			continue
		}
		for _, k := range from.keys {
			d.Set(k, from.m[k])
		}
	}
}

func asDict(v any) *Dict {
	d, _ := v.(*Dict)
	return d
}

func (d *Dict) Set(key string, v any) {
	if _, ok := d.m[key]; !ok {
		d.keys = append(d.keys, key)
	}
	d.m[key] = v
}

// Get returns the value of key.
func (d *Dict) Get(key string) (any, bool) {
	v, ok := d.m[key]
	return v, ok
}

// Keys returns the keys in order.
func (d *Dict) Keys() []string { return d.keys }

// Len is the number of keys.
func (d *Dict) Len() int { return len(d.keys) }

// Func is a function a template can call: positional and keyword arguments.
type Func func(args []any, kwargs *Dict) (any, error)

// FromJSON converts JSON into template values, keeping object key order and telling
// integers from floats by their literal.
func FromJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSON(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
}

func decodeJSON(dec *json.Decoder) (any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeJSON(dec)
				if err != nil {
					return nil, err
				}
				d.Set(kt.(string), v)
			}
			_, err := dec.Token()
			return d, err
		case '[':
			l := &List{}
			for dec.More() {
				v, err := decodeJSON(dec)
				if err != nil {
					return nil, err
				}
				l.Items = append(l.Items, v)
			}
			_, err := dec.Token()
			return l, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return i, nil
		}
		f, err := strconv.ParseFloat(string(t), 64)
		return f, err
	case string, bool, nil:
		return t, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", t)
}

// FromGo converts Go values (maps with string keys, slices, numbers, strings, bools)
// into template values. Map keys are sorted, as Go maps have no order.
func FromGo(v any) any {
	switch v := v.(type) {
	case nil, bool, int64, float64, string, *List, *Dict, Func, Undefined:
		return v
	case int:
		return int64(v)
	case int32:
		return int64(v)
	case float32:
		return float64(v)
	case []any:
		l := &List{Items: make([]any, len(v))}
		for i, x := range v {
			l.Items[i] = FromGo(x)
		}
		return l
	case []string:
		l := &List{Items: make([]any, len(v))}
		for i, x := range v {
			l.Items[i] = x
		}
		return l
	case []map[string]any:
		l := &List{Items: make([]any, len(v))}
		for i, x := range v {
			l.Items[i] = FromGo(x)
		}
		return l
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := NewDict()
		for _, k := range keys {
			d.Set(k, FromGo(v[k]))
		}
		return d
	case json.RawMessage:
		x, err := FromJSON(v)
		if err != nil {
			return Undefined{}
		}
		return x
	case func(args []any, kwargs *Dict) (any, error):
		return Func(v)
	}
	return fmt.Sprint(v)
}

func truthy(v any) bool {
	switch v := v.(type) {
	case nil, Undefined:
		return false
	case bool:
		return v
	case int64:
		return v != 0
	case float64:
		return v != 0
	case string:
		return v != ""
	case *List:
		return len(v.Items) > 0
	case *Dict:
		return v.namespace || v.Len() > 0
	}
	return true
}

// toStr is Python's str().
func toStr(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case Undefined:
		return ""
	}
	return repr(v)
}

// repr is Python's repr(). It panics with a *LimitError (Render recovers it) on a
// result over MaxValueBytes or a structure nested deeper than maxEvalDepth (a list
// that contains itself).
func repr(v any) string { return reprDepth(v, 0) }

func reprDepth(v any, depth int) string {
	if depth > maxEvalDepth {
		panic(&LimitError{Limit: "nesting depth", Size: int64(depth), Max: maxEvalDepth})
	}
	switch v := v.(type) {
	case nil:
		return "None"
	case Undefined:
		return ""
	case bool:
		if v {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(v, 10)
	case float64:
		return pyFloat(v)
	case string:
		if strings.Contains(v, "'") && !strings.Contains(v, "\"") {
			return "\"" + v + "\""
		}
		return "'" + strings.ReplaceAll(strings.ReplaceAll(v, "\\", "\\\\"), "'", "\\'") + "'"
	case *List:
		var size int64
		parts := make([]string, len(v.Items))
		for i, x := range v.Items {
			parts[i] = reprDepth(x, depth+1)
			size += int64(len(parts[i])) + 2
			mustFitString(size)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case *Dict:
		var size int64
		parts := make([]string, len(v.keys))
		for i, k := range v.keys {
			parts[i] = reprDepth(k, depth+1) + ": " + reprDepth(v.m[k], depth+1)
			size += int64(len(parts[i])) + 2
			mustFitString(size)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprintf("<%T>", v)
}

func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if a := math.Abs(f); a >= 1e16 || (a != 0 && a < 1e-4) {
		return strconv.FormatFloat(f, 'e', -1, 64)
	}
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return s
}

// toJSON is transformers' tojson: json.dumps(x, ensure_ascii=False, indent=indent)
// with its default separators and the dict order kept.
func toJSON(sb *strings.Builder, v any, indent, depth int, sep, kvsep string) error {
	if depth > maxEvalDepth {
		return &LimitError{Limit: "nesting depth", Size: int64(depth), Max: maxEvalDepth}
	}
	if err := fitString(int64(sb.Len())); err != nil {
		return err
	}
	nl := func(d int) {
		if indent > 0 {
			mustFitString(int64(sb.Len()) + sizeTimes(int64(indent), int64(d)))
			sb.WriteByte('\n')
			sb.WriteString(strings.Repeat(" ", indent*d))
		}
	}
	switch v := v.(type) {
	case nil, Undefined:
		sb.WriteString("null")
	case bool:
		sb.WriteString(map[bool]string{true: "true", false: "false"}[v])
	case int64:
		sb.WriteString(strconv.FormatInt(v, 10))
	case float64:
		switch {
		case math.IsNaN(v):
			sb.WriteString("NaN")
		case math.IsInf(v, 1):
			sb.WriteString("Infinity")
		case math.IsInf(v, -1):
			sb.WriteString("-Infinity")
		default:
			sb.WriteString(pyFloat(v))
		}
	case string:
		writeJSONString(sb, v)
	case *List:
		if len(v.Items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, x := range v.Items {
			if i > 0 {
				sb.WriteString(sep)
			}
			nl(depth + 1)
			if err := toJSON(sb, x, indent, depth+1, sep, kvsep); err != nil {
				return err
			}
		}
		nl(depth)
		sb.WriteByte(']')
	case *Dict:
		if v.Len() == 0 {
			sb.WriteString("{}")
			return nil
		}
		sb.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				sb.WriteString(sep)
			}
			nl(depth + 1)
			writeJSONString(sb, k)
			sb.WriteString(kvsep)
			if err := toJSON(sb, v.m[k], indent, depth+1, sep, kvsep); err != nil {
				return err
			}
		}
		nl(depth)
		sb.WriteByte('}')
	default:
		return fmt.Errorf("object of type %T is not JSON serializable", v)
	}
	return nil
}

func writeJSONString(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"':
			sb.WriteString(`\"`)
		case r == '\\':
			sb.WriteString(`\\`)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r == '\b':
			sb.WriteString(`\b`)
		case r == '\f':
			sb.WriteString(`\f`)
		case r < 0x20 || r == utf8.RuneError && size == 1:
			fmt.Fprintf(sb, `\u%04x`, r&0xffff)
		default:
			sb.WriteString(s[i : i+size])
		}
		i += size
	}
	sb.WriteByte('"')
}

// equal is Python's ==. It panics with a *LimitError (Render recovers it) on lists
// or dicts nested deeper than maxEvalDepth (one that contains itself).
func equal(a, b any) bool { return equalDepth(a, b, 0) }

func equalDepth(a, b any, depth int) bool {
	if depth > maxEvalDepth {
		panic(&LimitError{Limit: "nesting depth", Size: int64(depth), Max: maxEvalDepth})
	}
	if fa, ok := number(a); ok {
		if fb, ok := number(b); ok {
			return fa == fb
		}
		return false
	}
	switch a := a.(type) {
	case nil:
		return b == nil
	case Undefined:
		_, ok := b.(Undefined)
		return ok
	case string:
		bs, ok := b.(string)
		return ok && a == bs
	case *List:
		bl, ok := b.(*List)
		if !ok || len(a.Items) != len(bl.Items) {
			return false
		}
		for i := range a.Items {
			if !equalDepth(a.Items[i], bl.Items[i], depth+1) {
				return false
			}
		}
		return true
	case *Dict:
		bd, ok := b.(*Dict)
		if !ok || a.Len() != bd.Len() {
			return false
		}
		for _, k := range a.keys {
			bv, ok := bd.m[k]
			if !ok || !equalDepth(a.m[k], bv, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}

// number returns a bool, int or float as a float64.
func number(v any) (float64, bool) {
	switch v := v.(type) {
	case bool:
		if v {
			return 1, true
		}
		return 0, true
	case int64:
		return float64(v), true
	case float64:
		return v, true
	}
	return 0, false
}

// compare orders numbers with numbers and strings with strings.
func compare(a, b any) (int, error) {
	if fa, ok := number(a); ok {
		if fb, ok := number(b); ok {
			switch {
			case fa < fb:
				return -1, nil
			case fa > fb:
				return 1, nil
			}
			return 0, nil
		}
	}
	if sa, ok := a.(string); ok {
		if sb, ok := b.(string); ok {
			return strings.Compare(sa, sb), nil
		}
	}
	if la, ok := a.(*List); ok {
		if lb, ok := b.(*List); ok {
			for i := 0; i < len(la.Items) && i < len(lb.Items); i++ {
				if c, err := compare(la.Items[i], lb.Items[i]); err != nil || c != 0 {
					return c, err
				}
			}
			return len(la.Items) - len(lb.Items), nil
		}
	}
	return 0, fmt.Errorf("cannot compare %s with %s", typeName(a), typeName(b))
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case Undefined:
		return "undefined"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case *List:
		return "list"
	case *Dict:
		return "dict"
	}
	return "function"
}

// iterate returns the items a for loop visits: list items, dict keys, string
// characters; nothing for undefined or none.
func iterate(v any) ([]any, error) {
	switch v := v.(type) {
	case *List:
		return v.Items, nil
	case *Dict:
		out := make([]any, len(v.keys))
		for i, k := range v.keys {
			out[i] = k
		}
		return out, nil
	case string:
		if err := fitList(int64(utf8.RuneCountInString(v))); err != nil {
			return nil, err
		}
		var out []any
		for _, r := range v {
			out = append(out, string(r))
		}
		return out, nil
	case Undefined, nil:
		return nil, nil
	}
	return nil, fmt.Errorf("%s is not iterable", typeName(v))
}

package jinja

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Now is the clock strftime_now reads; tests replace it.
var Now = time.Now

func builtinGlobals() map[string]any {
	return map[string]any{
		"raise_exception": Func(func(args []any, _ *Dict) (any, error) {
			msg := "the chat template raised an error"
			if len(args) > 0 {
				msg = toStr(args[0])
			}
			return nil, &RaisedError{Message: msg}
		}),
		"range": Func(func(args []any, _ *Dict) (any, error) {
			var b [3]int64
			b[2] = 1
			ints := make([]int64, len(args))
			for i, a := range args {
				v, ok := a.(int64)
				if !ok {
					return nil, fmt.Errorf("range() takes integers, not %s", typeName(a))
				}
				ints[i] = v
			}
			switch len(ints) {
			case 1:
				b[1] = ints[0]
			case 2, 3:
				copy(b[:], ints)
			default:
				return nil, errors.New("range() takes 1 to 3 arguments")
			}
			if b[2] == 0 {
				return nil, errors.New("range() step must not be zero")
			}
			l := &List{}
			for i := b[0]; (b[2] > 0 && i < b[1]) || (b[2] < 0 && i > b[1]); i += b[2] {
				if len(l.Items) >= 1<<20 {
					return nil, errors.New("range() too large")
				}
				l.Items = append(l.Items, i)
			}
			return l, nil
		}),
		"namespace": Func(func(args []any, kw *Dict) (any, error) {
			d := NewDict()
			d.namespace = true
			var src any
			if len(args) == 1 {
				src = args[0]
			}
			d.merge(src, kw)
			return d, nil
		}),
		"dict": Func(func(_ []any, kw *Dict) (any, error) {
			d := NewDict()
			d.merge(nil, kw)
			return d, nil
		}),
		"strftime_now": Func(func(args []any, _ *Dict) (any, error) {
			if len(args) != 1 {
				return nil, errors.New("strftime_now() takes a format")
			}
			return strftime(Now(), toStr(args[0])), nil
		}),
	}
}

// strftime formats t with the C directives templates use.
func strftime(t time.Time, f string) string {
	var sb strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			sb.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'd':
			fmt.Fprintf(&sb, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&sb, "%2d", t.Day())
		case 'm':
			fmt.Fprintf(&sb, "%02d", int(t.Month()))
		case 'Y':
			fmt.Fprintf(&sb, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&sb, "%02d", t.Year()%100)
		case 'b', 'h':
			sb.WriteString(t.Month().String()[:3])
		case 'B':
			sb.WriteString(t.Month().String())
		case 'a':
			sb.WriteString(t.Weekday().String()[:3])
		case 'A':
			sb.WriteString(t.Weekday().String())
		case 'H':
			fmt.Fprintf(&sb, "%02d", t.Hour())
		case 'I':
			fmt.Fprintf(&sb, "%02d", (t.Hour()+11)%12+1)
		case 'p':
			sb.WriteString(map[bool]string{true: "AM", false: "PM"}[t.Hour() < 12])
		case 'M':
			fmt.Fprintf(&sb, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&sb, "%02d", t.Second())
		case 'j':
			fmt.Fprintf(&sb, "%03d", t.YearDay())
		case '%':
			sb.WriteByte('%')
		default:
			sb.WriteByte('%')
			sb.WriteByte(f[i])
		}
	}
	return sb.String()
}

func (r *renderer) evalTest(t *testExpr, sc *scope) (any, error) {
	v, err := r.eval(t.e, sc)
	if err != nil {
		return nil, err
	}
	args, _, err := r.evalArgs(t.args, nil, sc)
	if err != nil {
		return nil, err
	}
	w := weight(v)
	for _, a := range args {
		w = satAdd(w, weight(a))
	}
	if err := r.work(w); err != nil {
		return nil, wrapLine(err, t.line)
	}
	ok, err := applyTest(t.name, v, args)
	if err != nil {
		return nil, wrapLine(err, t.line)
	}
	return ok != t.negated, nil
}

// testFunc is one test ("is name"): name is the name it was called by (several tests
// share a function), v the value tested.
type testFunc func(name string, v any, args []any) (bool, error)

// tests maps each test's name to its function.
var tests = map[string]testFunc{
	"defined":   typeTest(func(v any) bool { _, undef := v.(Undefined); return !undef }),
	"undefined": typeTest(func(v any) bool { _, undef := v.(Undefined); return undef }),
	"none":      typeTest(func(v any) bool { return v == nil }),
	"string":    typeTest(func(v any) bool { _, ok := v.(string); return ok }),
	"number": typeTest(func(v any) bool {
		switch v.(type) {
		case int64, float64:
			return true
		}
		return false
	}),
	"integer":  typeTest(func(v any) bool { _, ok := v.(int64); return ok }),
	"float":    typeTest(func(v any) bool { _, ok := v.(float64); return ok }),
	"boolean":  typeTest(func(v any) bool { _, ok := v.(bool); return ok }),
	"true":     typeTest(func(v any) bool { return v == true }),
	"false":    typeTest(func(v any) bool { return v == false }),
	"mapping":  typeTest(func(v any) bool { _, ok := v.(*Dict); return ok }),
	"iterable": typeTest(isSequence),
	"sequence": typeTest(isSequence),
	"callable": typeTest(func(v any) bool { _, ok := v.(Func); return ok }),
	"odd":      testOddEven,
	"even":     testOddEven,
	"divisibleby": argTest(func(_ string, v, x any) (bool, error) {
		i, ok1 := v.(int64)
		d, ok2 := x.(int64)
		if !ok1 || !ok2 || d == 0 {
			return false, errors.New("divisibleby needs non-zero integers")
		}
		return i%d == 0, nil
	}),
	"equalto": argTest(testEqual),
	"eq":      argTest(testEqual),
	"==":      argTest(testEqual),
	"sameas":  argTest(testEqual),
	"ne": func(name string, v any, args []any) (bool, error) {
		x, err := testArg(name, args)
		return !equal(v, x), err
	},
	"in":    argTest(func(_ string, v, x any) (bool, error) { return contains(x, v) }),
	"lower": typeTest(func(v any) bool { s, ok := v.(string); return ok && s == strings.ToLower(s) }),
	"upper": typeTest(func(v any) bool { s, ok := v.(string); return ok && s == strings.ToUpper(s) }),
}

func init() {
	tests["!="] = tests["ne"]
	for _, name := range []string{"lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">="} {
		tests[name] = argTest(testCompare)
	}
}

func applyTest(name string, v any, args []any) (bool, error) {
	if t, ok := tests[name]; ok {
		return t(name, v, args)
	}
	return false, fmt.Errorf("unknown test %q", name)
}

// typeTest is a test of v alone.
func typeTest(is func(v any) bool) testFunc {
	return func(_ string, v any, _ []any) (bool, error) { return is(v), nil }
}

// argTest is a test that needs an argument x.
func argTest(is func(name string, v, x any) (bool, error)) testFunc {
	return func(name string, v any, args []any) (bool, error) {
		x, err := testArg(name, args)
		if err != nil {
			return false, err
		}
		return is(name, v, x)
	}
}

// testArg is the argument of test name.
func testArg(name string, args []any) (any, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("test %s needs an argument", name)
	}
	return args[0], nil
}

func isSequence(v any) bool {
	switch v.(type) {
	case *List, *Dict, string:
		return true
	}
	return false
}

func testOddEven(name string, v any, _ []any) (bool, error) {
	i, ok := v.(int64)
	if !ok {
		return false, fmt.Errorf("test %s needs an integer", name)
	}
	return (i%2 != 0) == (name == "odd"), nil
}

// testEqual is equalto, eq, == and sameas (identity only for none and booleans).
func testEqual(name string, v, x any) (bool, error) {
	if name == "sameas" {
		switch v.(type) {
		case nil, bool:
			return v == x, nil
		}
	}
	return equal(v, x), nil
}

// testCompare is the ordering tests: lt, le, gt, ge and their other spellings.
func testCompare(name string, v, x any) (bool, error) {
	c, err := compare(v, x)
	if err != nil {
		return false, err
	}
	switch name {
	case "lt", "lessthan", "<":
		return c < 0, nil
	case "le", "<=":
		return c <= 0, nil
	case "gt", "greaterthan", ">":
		return c > 0, nil
	}
	return c >= 0, nil
}

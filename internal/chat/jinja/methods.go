package jinja

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// method returns the bound method name of v (Python's str, list and dict methods that
// chat templates call), or nil.
func method(v any, name string) Func {
	switch x := v.(type) {
	case string:
		return stringMethod(x, name)
	case *List:
		return listMethod(x, name)
	case *Dict:
		return dictMethod(x, name)
	}
	return nil
}

// stringMethods maps each str method's name to a constructor of the method bound to a
// string; name is the name it was called by (several methods share a constructor).
var stringMethods = map[string]func(s, name string) Func{
	"strip": func(s, _ string) Func { return stripMethod(s, strings.Trim, strings.TrimSpace) },
	"lstrip": func(s, _ string) Func {
		return stripMethod(s, strings.TrimLeft, func(s string) string { return strings.TrimLeftFunc(s, unicode.IsSpace) })
	},
	"rstrip": func(s, _ string) Func {
		return stripMethod(s, strings.TrimRight, func(s string) string { return strings.TrimRightFunc(s, unicode.IsSpace) })
	},
	"upper":      func(s, _ string) Func { return mapMethod(s, strings.ToUpper) },
	"lower":      func(s, _ string) Func { return mapMethod(s, strings.ToLower) },
	"title":      func(s, _ string) Func { return mapMethod(s, pyTitle) },
	"capitalize": func(s, _ string) Func { return mapMethod(s, capitalize) },
	"startswith": affixMethod,
	"endswith":   affixMethod,
	"split":      splitMethod,
	"rsplit":     splitMethod,
	"splitlines": splitlinesMethod,
	"replace":    replaceMethod,
	"find":       findMethod,
	"rfind":      findMethod,
	"index":      findMethod,
	"count":      findMethod,
	"join":       joinMethod,
	"format": func(s, _ string) Func {
		return func(args []any, kw *Dict) (any, error) { return braceFormat(s, args, kw) }
	},
	"isdigit": classMethod,
	"isalpha": classMethod,
	"isspace": classMethod,
	"isupper": classMethod,
	"islower": classMethod,
}

func stringMethod(s, name string) Func {
	if m, ok := stringMethods[name]; ok {
		return m(s, name)
	}
	return nil
}

// stripMethod is strip, lstrip or rstrip of s: fn with the characters given, else
// fnSpace.
func stripMethod(s string, fn func(string, string) string, fnSpace func(string) string) Func {
	return func(args []any, _ *Dict) (any, error) {
		if len(args) > 0 && args[0] != nil {
			return fn(s, toStr(args[0])), nil
		}
		return fnSpace(s), nil
	}
}

// mapMethod is a method without arguments that maps s through fn when called.
func mapMethod(s string, fn func(string) string) Func {
	return func([]any, *Dict) (any, error) { return fn(s), nil }
}

// affixMethod is startswith and endswith: the argument is a prefix (suffix) or a list
// of candidates.
func affixMethod(s, name string) Func {
	return func(args []any, _ *Dict) (any, error) {
		if len(args) == 0 {
			return nil, fmt.Errorf("%s() needs an argument", name)
		}
		var cands []any
		if l, ok := args[0].(*List); ok {
			cands = l.Items
		} else {
			cands = []any{args[0]}
		}
		for _, c := range cands {
			p := toStr(c)
			if (name == "startswith" && strings.HasPrefix(s, p)) || (name == "endswith" && strings.HasSuffix(s, p)) {
				return true, nil
			}
		}
		return false, nil
	}
}

// splitMethod is split and rsplit.
func splitMethod(s, name string) Func {
	return func(args []any, kw *Dict) (any, error) {
		sep := arg(args, kw, 0, "sep", nil)
		n := -1
		if m, ok := arg(args, kw, 1, "maxsplit", nil).(int64); ok {
			n = int(m)
		}
		var parts []string
		switch {
		case sep == nil:
			parts = splitSpace(s, n)
		case toStr(sep) == "":
			return nil, errors.New("empty separator")
		case name == "rsplit" && n >= 0:
			all := strings.Split(s, toStr(sep))
			if len(all) > n+1 {
				head := strings.Join(all[:len(all)-n], toStr(sep))
				all = append([]string{head}, all[len(all)-n:]...)
			}
			parts = all
		default:
			parts = strings.SplitN(s, toStr(sep), n)
		}
		out := &List{Items: make([]any, len(parts))}
		for i, p := range parts {
			out.Items[i] = p
		}
		return out, nil
	}
}

func splitlinesMethod(s, _ string) Func {
	return func([]any, *Dict) (any, error) {
		out := &List{}
		for _, l := range strings.SplitAfter(s, "\n") {
			if l == "" {
				continue
			}
			out.Items = append(out.Items, strings.TrimRight(l, "\r\n"))
		}
		return out, nil
	}
}

func replaceMethod(s, _ string) Func {
	return func(args []any, kw *Dict) (any, error) {
		if len(args) < 2 {
			return nil, errors.New("replace() needs old and new")
		}
		n := -1
		if c, ok := arg(args, kw, 2, "count", nil).(int64); ok {
			n = int(c)
		}
		return replaceString(s, toStr(args[0]), toStr(args[1]), n)
	}
}

// findMethod is find, rfind, index and count.
func findMethod(s, name string) Func {
	return func(args []any, _ *Dict) (any, error) {
		if len(args) == 0 {
			return nil, fmt.Errorf("%s() needs an argument", name)
		}
		sub := toStr(args[0])
		var i int
		switch name {
		case "find", "index":
			i = strings.Index(s, sub)
		case "rfind":
			i = strings.LastIndex(s, sub)
		case "count":
			return int64(strings.Count(s, sub)), nil
		}
		if i < 0 && name == "index" {
			return nil, errors.New("substring not found")
		}
		if i >= 0 {
			i = len([]rune(s[:i]))
		}
		return int64(i), nil
	}
}

func joinMethod(s, _ string) Func {
	return func(args []any, _ *Dict) (any, error) {
		if len(args) == 0 {
			return nil, errors.New("join() needs an iterable")
		}
		items, err := iterate(args[0])
		if err != nil {
			return nil, err
		}
		parts := make([]string, len(items))
		for i, it := range items {
			parts[i] = toStr(it)
		}
		return joinStrings(parts, s)
	}
}

// classMethod is isdigit, isalpha, isspace, isupper and islower.
func classMethod(s, name string) Func {
	return func([]any, *Dict) (any, error) {
		if s == "" {
			return false, nil
		}
		for _, c := range s {
			ok := map[string]bool{"isdigit": unicode.IsDigit(c), "isalpha": unicode.IsLetter(c),
				"isspace": unicode.IsSpace(c), "isupper": !unicode.IsLower(c), "islower": !unicode.IsUpper(c)}[name]
			if !ok {
				return false, nil
			}
		}
		return true, nil
	}
}

// braceFormat is str.format with {} and {name} fields.
func braceFormat(s string, args []any, kw *Dict) (string, error) {
	var sb strings.Builder
	auto := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '{' && i+1 < len(s) && s[i+1] == '{' || c == '}' && i+1 < len(s) && s[i+1] == '}' {
			sb.WriteByte(c)
			i++
			continue
		}
		if c != '{' {
			sb.WriteByte(c)
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", errors.New("single '{' in format string")
		}
		field := s[i+1 : i+end]
		i += end
		switch {
		case field == "":
			if auto >= len(args) {
				return "", errors.New("not enough arguments for format()")
			}
			sb.WriteString(toStr(args[auto]))
			auto++
			mustFitString(int64(sb.Len()))
		case field[0] >= '0' && field[0] <= '9':
			var n int
			fmt.Sscanf(field, "%d", &n)
			if n >= len(args) {
				return "", errors.New("format() index out of range")
			}
			sb.WriteString(toStr(args[n]))
			mustFitString(int64(sb.Len()))
		default:
			v, ok := any(nil), false
			if kw != nil {
				v, ok = kw.Get(field)
			}
			if !ok {
				return "", fmt.Errorf("format() has no argument %q", field)
			}
			sb.WriteString(toStr(v))
			mustFitString(int64(sb.Len()))
		}
	}
	return sb.String(), nil
}

func listMethod(l *List, name string) Func {
	switch name {
	case "append":
		return func(args []any, _ *Dict) (any, error) {
			if len(args) != 1 {
				return nil, errors.New("append() takes one argument")
			}
			l.Items = append(l.Items, args[0])
			return nil, nil
		}
	case "pop":
		return func(args []any, _ *Dict) (any, error) {
			if len(l.Items) == 0 {
				return nil, errors.New("pop from empty list")
			}
			i := len(l.Items) - 1
			if len(args) > 0 {
				if n, ok := args[0].(int64); ok {
					i = int(n)
					if i < 0 {
						i += len(l.Items)
					}
				}
			}
			if i < 0 || i >= len(l.Items) {
				return nil, errors.New("pop index out of range")
			}
			v := l.Items[i]
			l.Items = append(l.Items[:i], l.Items[i+1:]...)
			return v, nil
		}
	case "index", "count":
		return func(args []any, _ *Dict) (any, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("%s() needs an argument", name)
			}
			n := 0
			for i, x := range l.Items {
				if equal(x, args[0]) {
					if name == "index" {
						return int64(i), nil
					}
					n++
				}
			}
			if name == "index" {
				return nil, errors.New("value is not in list")
			}
			return int64(n), nil
		}
	}
	return nil
}

func dictMethod(d *Dict, name string) Func {
	switch name {
	case "items":
		return func([]any, *Dict) (any, error) { return dictItems(d), nil }
	case "keys":
		return func([]any, *Dict) (any, error) {
			out := &List{Items: make([]any, len(d.keys))}
			for i, k := range d.keys {
				out.Items[i] = k
			}
			return out, nil
		}
	case "values":
		return func([]any, *Dict) (any, error) {
			out := &List{Items: make([]any, len(d.keys))}
			for i, k := range d.keys {
				out.Items[i] = d.m[k]
			}
			return out, nil
		}
	case "get":
		return func(args []any, _ *Dict) (any, error) {
			if len(args) == 0 {
				return nil, errors.New("get() needs a key")
			}
			if v, ok := d.Get(toStr(args[0])); ok {
				return v, nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return nil, nil
		}
	case "update":
		return func(args []any, kw *Dict) (any, error) {
			var src any
			if len(args) > 0 {
				src = args[0]
			}
			d.merge(src, kw)
			return nil, nil
		}
	}
	return nil
}

// splitSpace is Python's str.split(None, n): runs of whitespace separate fields; after
// n splits the rest is one field with its trailing whitespace kept.
func splitSpace(s string, n int) []string {
	parts := []string{}
	rest := s
	for {
		rest = strings.TrimLeftFunc(rest, unicode.IsSpace)
		if rest == "" {
			return parts
		}
		if n >= 0 && len(parts) == n {
			return append(parts, rest)
		}
		i := strings.IndexFunc(rest, unicode.IsSpace)
		if i < 0 {
			return append(parts, rest)
		}
		parts = append(parts, rest[:i])
		rest = rest[i:]
	}
}

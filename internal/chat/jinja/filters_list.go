package jinja

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// The filters over lists (and dicts): what applyFilter dispatches to by name.

func filterFirstLast(name string, v any, _ []any, _ *Dict) (any, error) {
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
}

func filterJoin(_ string, v any, args []any, kw *Dict) (any, error) {
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
}

func filterList(_ string, v any, _ []any, _ *Dict) (any, error) {
	items, err := iterate(v)
	return &List{Items: append([]any{}, items...)}, err
}

func filterItems(_ string, v any, _ []any, _ *Dict) (any, error) {
	d, ok := v.(*Dict)
	if !ok {
		if _, undef := v.(Undefined); undef {
			return &List{}, nil
		}
		return nil, fmt.Errorf("items needs a dict, not %s", typeName(v))
	}
	return dictItems(d), nil
}

func filterDictsort(_ string, v any, _ []any, _ *Dict) (any, error) {
	d, ok := v.(*Dict)
	if !ok {
		return nil, fmt.Errorf("dictsort needs a dict, not %s", typeName(v))
	}
	items := dictItems(d)
	sort.SliceStable(items.Items, func(i, j int) bool {
		return items.Items[i].(*List).Items[0].(string) < items.Items[j].(*List).Items[0].(string)
	})
	return items, nil
}

func filterReverse(_ string, v any, _ []any, _ *Dict) (any, error) {
	if x, ok := v.(string); ok {
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
}

func filterSort(_ string, v any, args []any, kw *Dict) (any, error) {
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
}

func filterUnique(_ string, v any, _ []any, _ *Dict) (any, error) {
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
}

func filterMap(_ string, v any, args []any, kw *Dict) (any, error) {
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
}

// filterSelect is select, reject, selectattr and rejectattr.
func filterSelect(name string, v any, args []any, _ *Dict) (any, error) {
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
}

func filterSum(_ string, v any, args []any, kw *Dict) (any, error) {
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
}

func filterMinMax(name string, v any, _ []any, _ *Dict) (any, error) {
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
}

func filterBatch(_ string, v any, args []any, kw *Dict) (any, error) {
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
}

func dictItems(d *Dict) *List {
	out := &List{Items: make([]any, len(d.keys))}
	for i, k := range d.keys {
		out.Items[i] = &List{Items: []any{k, d.m[k]}}
	}
	return out
}

package jinja

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// MaxWork bounds the work of one rendering, counted in the bytes and items its
// operations go through: a search or a comparison its strings, a filter its list and
// what the list holds, a list method its items, what is written the output. Steps
// bound how many operations a template runs and the size limits how large each value
// is, but not their product: a million steps each searching a 32 MiB string take
// hours. A GiB of work is about a second of CPU at the pace of the slowest operation
// and hundreds of times what the real templates spend on a conversation that fills a
// model's context.
const MaxWork = 1 << 30

// work counts n units of work against the rendering's budget.
func (r *renderer) work(n int64) error {
	r.b.work = satAdd(r.b.work, n)
	if r.b.work > r.b.maxWork {
		return &LimitError{Limit: "work", Size: r.b.work, Max: r.b.maxWork}
	}
	return nil
}

// left is the work the rendering may still do: the most a weight needs counting to.
func (r *renderer) left() int64 { return max(r.b.maxWork-r.b.work, 0) + 1 }

func satAdd(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 { return sizeTimes(max(a, 0), max(b, 0)) }

// itemWeight is what an item of a list or dict weighs: walking items (a type switch
// and an indirection each) is several times slower than walking bytes, and a GiB of
// work must stay about a second of CPU either way.
const itemWeight = 16

// weight is what an operation goes through when it walks v once: a string's bytes,
// a list's or dict's items (not what they hold); one for anything else.
func weight(v any) int64 {
	switch v := v.(type) {
	case string:
		return int64(len(v)) + 1
	case *List:
		return itemWeight*int64(len(v.Items)) + 1
	case *Dict:
		return itemWeight*int64(v.Len()) + 1
	}
	return 1
}

// weightItems is weight(v) plus the weight of each thing v holds, for the filters
// that apply something to every item.
func weightItems(v any) int64 {
	n := weight(v)
	switch v := v.(type) {
	case *List:
		for _, x := range v.Items {
			n = satAdd(n, weight(x))
		}
	case *Dict:
		for _, k := range v.keys {
			n = satAdd(n, int64(len(k))+weight(v.m[k]))
		}
	}
	return n
}

// deepWeight is weight through every nested list and dict, as a comparison walks
// them, counted only up to limit (a list may hold itself, or the same big list a
// million times).
func deepWeight(v any, limit int64) int64 {
	n := int64(0)
	var walk func(v any, depth int)
	walk = func(v any, depth int) {
		n = satAdd(n, weight(v))
		if n > limit || depth > maxEvalDepth { // the comparison stops there too
			return
		}
		switch v := v.(type) {
		case *List:
			for _, x := range v.Items {
				if walk(x, depth+1); n > limit {
					return
				}
			}
		case *Dict:
			for _, k := range v.keys {
				if walk(v.m[k], depth+1); n > limit {
					return
				}
			}
		}
	}
	walk(v, 0)
	return n
}

// operandsWeight is the work of a binary operation, counted before it runs: the
// weight of its operands, through nested lists and dicts for the comparisons that
// walk them (a key looked up in a dict walks only the key). What it builds is
// counted after (weight).
func (r *renderer) operandsWeight(op string, l, rv any) int64 {
	if !isContainer(l) && !isContainer(rv) {
		return satAdd(weight(l), weight(rv))
	}
	switch op {
	case "in", "not in":
		if _, ok := rv.(*Dict); ok {
			return weight(l) + 1
		}
		return satAdd(deepWeight(l, r.left()), deepWeight(rv, r.left()))
	case "==", "!=", "<", ">", "<=", ">=":
		return satAdd(deepWeight(l, r.left()), deepWeight(rv, r.left()))
	}
	return satAdd(weight(l), weight(rv))
}

func isContainer(v any) bool {
	switch v.(type) {
	case *List, *Dict:
		return true
	}
	return false
}

// filterWork is the work of filter name on v with args, counted before it runs: v
// and what it holds, the arguments once and once an item (a test applied to each);
// unique compares every item with those kept before it, sort each with log n others.
// What the filter returns is counted after (weightItems).
func (r *renderer) filterWork(name string, v any, args []any, kw *Dict) int64 {
	argw := int64(0)
	for _, a := range args {
		argw = satAdd(argw, weight(a))
	}
	if kw != nil {
		argw = satAdd(argw, weightItems(kw))
	}
	items := int64(0)
	if l, ok := v.(*List); ok {
		items = int64(len(l.Items))
	}
	n := satAdd(weightItems(v), satMul(items+1, argw))
	switch name {
	case "unique":
		n = satAdd(n, satMul(items, deepWeight(v, r.left())))
	case "sort", "dictsort":
		n = satAdd(n, satMul(int64(bits.Len64(uint64(items))), deepWeight(v, r.left())))
	}
	return n
}

// methodWork is the work of a method of obj: the list methods that add or take one
// item and dict.get are constant; the others walk their receiver (a list's index and
// count compare each item).
func (r *renderer) methodWork(obj any, name string) int64 {
	switch obj.(type) {
	case *List:
		switch name {
		case "append", "pop":
			return 1
		case "index", "count":
			return deepWeight(obj, r.left())
		}
	case *Dict:
		if name == "get" {
			return 1
		}
	}
	return weight(obj)
}

// strIndexMin is the length from which a string's rune index is kept: shorter
// strings are walked each time.
const strIndexMin = 256

// maxStrIndexes bounds the rune indexes one rendering keeps.
const maxStrIndexes = 64

// runeStep is how many runes apart a non-ASCII string's index marks its offsets.
const runeStep = 64

// strIndex finds the runes of a string in constant time: a string of ASCII bytes is
// indexed by byte; another keeps the byte offset of every runeStep-th rune.
type strIndex struct {
	s     string
	runes int
	ascii bool
	marks []int32
}

// strKey names a string by where its bytes are and how many: strings do not change,
// and the index holds the string, so its bytes are not reused for another.
type strKey struct {
	p *byte
	n int
}

// runes returns the index of s, made (and its work counted) the first time a long
// string is asked for.
func (r *renderer) runes(s string) (*strIndex, error) {
	if len(s) >= strIndexMin {
		if x, ok := r.b.strs[strKey{unsafe.StringData(s), len(s)}]; ok {
			return x, r.work(1)
		}
	}
	if err := r.work(weight(s)); err != nil {
		return nil, err
	}
	x := &strIndex{s: s, runes: utf8.RuneCountInString(s)}
	x.ascii = x.runes == len(s)
	if !x.ascii { // a second walk, rune by rune
		if err := r.work(weight(s)); err != nil {
			return nil, err
		}
		x.marks = make([]int32, 0, x.runes/runeStep+1)
		i := 0
		for off := range s {
			if i%runeStep == 0 {
				x.marks = append(x.marks, int32(off))
			}
			i++
		}
	}
	if len(s) >= strIndexMin {
		if len(r.b.strs) >= maxStrIndexes || r.b.strs == nil {
			r.b.strs = map[strKey]*strIndex{}
		}
		r.b.strs[strKey{unsafe.StringData(s), len(s)}] = x
	}
	return x, nil
}

// offset is the byte offset of rune i (0 <= i <= runes).
func (x *strIndex) offset(i int) int {
	if i >= x.runes {
		return len(x.s)
	}
	if x.ascii {
		return i
	}
	off := int(x.marks[i/runeStep])
	for range i % runeStep {
		_, size := utf8.DecodeRuneInString(x.s[off:])
		off += size
	}
	return off
}

// at is rune i as a string, as Python's s[i] (an invalid byte is U+FFFD).
func (x *strIndex) at(i int) string {
	if x.ascii {
		return x.s[i : i+1]
	}
	r, _ := utf8.DecodeRuneInString(x.s[x.offset(i):])
	return string(r)
}

// sliceString is the runes of sl (a step other than 1) as a string, walked in
// order rather than found one by one (each at most runeStep runes from a mark).
func (x *strIndex) sliceString(sl slice) string {
	var sb strings.Builder
	if x.ascii || sl.step >= runeStep || -sl.step >= runeStep {
		for k := range sl.count {
			sb.WriteString(x.at(sl.start + k*sl.step))
		}
		return sb.String()
	}
	if sl.step > 0 {
		off := x.offset(sl.start)
		for k := range sl.count {
			for j := range sl.step {
				r, size := utf8.DecodeRuneInString(x.s[off:])
				if j == 0 {
					sb.WriteRune(r)
				}
				off += size
				if off >= len(x.s) && k < sl.count-1 {
					return sb.String()
				}
			}
		}
		return sb.String()
	}
	end := x.offset(sl.start + 1) // the end of the first rune, walked back from
	for range sl.count {
		for j := range -sl.step {
			r, size := utf8.DecodeLastRuneInString(x.s[:end])
			if j == 0 {
				sb.WriteRune(r)
			}
			end -= size
			if end <= 0 {
				return sb.String()
			}
		}
	}
	return sb.String()
}

// indexString is s[key].
func (r *renderer) indexString(s string, key any) (any, error) {
	i, ok := key.(int64)
	if !ok {
		return nil, fmt.Errorf("string indices must be integers, not %s", typeName(key))
	}
	x, err := r.runes(s)
	if err != nil {
		return nil, err
	}
	if i < 0 {
		i += int64(x.runes)
	}
	if i < 0 || i >= int64(x.runes) {
		return Undefined{}, nil
	}
	return x.at(int(i)), nil
}

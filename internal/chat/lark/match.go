package lark

import (
	"slices"
	"unicode/utf8"
)

// Match reports whether the grammar's start rule matches all of text.
func (g *Grammar) Match(text string) bool {
	m := &matcher{g: g, text: text, memo: map[memoKey][]int{}}
	return slices.Contains(m.ends(ref(g.start), 0), len(text))
}

type memoKey struct {
	rule string
	pos  int
}

// matcher finds where an expression's matches starting at a position end: every
// end, so that alternatives and repetitions need no backtracking. Rules are memoized
// by position; the grammar has no left recursion (check), so none recurses at the
// same position.
type matcher struct {
	g    *Grammar
	text string
	memo map[memoKey][]int
}

func (m *matcher) ends(x expr, pos int) []int {
	switch x := x.(type) {
	case lit:
		if len(m.text)-pos >= len(x) && m.text[pos:pos+len(x)] == string(x) {
			return []int{pos + len(x)}
		}
		return nil
	case class:
		r, n := utf8.DecodeRuneInString(m.text[pos:])
		if n > 0 && x.has(r) {
			return []int{pos + n}
		}
		return nil
	case ref:
		k := memoKey{string(x), pos}
		if e, ok := m.memo[k]; ok {
			return e
		}
		e := m.ends(m.g.rules[string(x)], pos)
		m.memo[k] = e
		return e
	case seq:
		at := []int{pos}
		for _, y := range x {
			at = m.all(y, at)
		}
		return at
	case alt:
		var out []int
		for _, y := range x {
			out = union(out, m.ends(y, pos))
		}
		return out
	case rep:
		return m.repeat(x, pos)
	}
	return nil
}

// all are the ends of x from each of the positions at.
func (m *matcher) all(x expr, at []int) []int {
	var out []int
	for _, p := range at {
		out = union(out, m.ends(x, p))
	}
	return out
}

// repeat are the ends of min to max matches of r.x from pos.
func (m *matcher) repeat(r rep, pos int) []int {
	var out []int
	at := []int{pos}
	seen := map[int]bool{}
	for n := 0; len(at) > 0 && (r.max < 0 || n <= r.max); n++ {
		if n >= r.min {
			out = union(out, at)
		}
		if r.max >= 0 && n == r.max {
			break
		}
		next := m.all(r.x, at)
		// Past min, positions already reached add nothing new.
		if n >= r.min {
			next = slices.DeleteFunc(next, func(p int) bool { return seen[p] })
			for _, p := range at {
				seen[p] = true
			}
		}
		at = next
	}
	return out
}

// union merges sorted position lists.
func union(a, b []int) []int {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

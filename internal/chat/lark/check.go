package lark

import "strings"

// check refuses what llama.cpp's grammar sampler cannot run: a missing start rule,
// names never defined, left recursion (its parser refuses it), and repetitions of
// what can be empty (they would loop without consuming text).
func (g *Grammar) check() *Error {
	if _, ok := g.rules[g.start]; !ok {
		return errorf(0, "start", "the grammar has no %q rule: Lark grammars start there", g.start)
	}
	for _, name := range g.order {
		if e := g.checkRefs(g.rules[name], name); e != nil {
			return e
		}
	}
	nullable := g.nullable()
	for _, name := range g.order {
		if e := checkRepeats(g.rules[name], name, nullable); e != nil {
			return e
		}
	}
	// Left recursion: a rule reachable from itself through leftmost references.
	first := map[string][]string{}
	for _, name := range g.order {
		first[name] = leftRefs(g.rules[name], nullable, nil)
	}
	for _, name := range g.order {
		if path := leftCycle(name, name, first, map[string]bool{}); path != nil {
			return errorf(0, "left recursion", "rule %s is left-recursive (%s → %s): write it with repetition, "+
				"e.g. item (\",\" item)* instead of list \",\" item", name, name, strings.Join(path, " → "))
		}
	}
	return nil
}

// checkRefs refuses references to names never defined.
func (g *Grammar) checkRefs(x expr, in string) *Error {
	switch x := x.(type) {
	case ref:
		if _, ok := g.rules[string(x)]; !ok {
			return errorf(0, "undefined name", "%s (used in %s) is not defined", string(x), in)
		}
	case seq:
		for _, y := range x {
			if e := g.checkRefs(y, in); e != nil {
				return e
			}
		}
	case alt:
		for _, y := range x {
			if e := g.checkRefs(y, in); e != nil {
				return e
			}
		}
	case rep:
		return g.checkRefs(x.x, in)
	}
	return nil
}

// nullable is the set of rules that match the empty string.
func (g *Grammar) nullable() map[string]bool {
	n := map[string]bool{}
	for changed := true; changed; {
		changed = false
		for _, name := range g.order {
			if !n[name] && canBeEmpty(g.rules[name], n) {
				n[name], changed = true, true
			}
		}
	}
	return n
}

func canBeEmpty(x expr, nullable map[string]bool) bool {
	switch x := x.(type) {
	case lit:
		return x == ""
	case class:
		return false
	case ref:
		return nullable[string(x)]
	case seq:
		for _, y := range x {
			if !canBeEmpty(y, nullable) {
				return false
			}
		}
		return true
	case alt:
		for _, y := range x {
			if canBeEmpty(y, nullable) {
				return true
			}
		}
		return false
	case rep:
		return x.min == 0 || canBeEmpty(x.x, nullable)
	}
	return false
}

func checkRepeats(x expr, in string, nullable map[string]bool) *Error {
	switch x := x.(type) {
	case seq:
		for _, y := range x {
			if e := checkRepeats(y, in, nullable); e != nil {
				return e
			}
		}
	case alt:
		for _, y := range x {
			if e := checkRepeats(y, in, nullable); e != nil {
				return e
			}
		}
	case rep:
		if x.max != 1 && x.max != 0 && canBeEmpty(x.x, nullable) {
			return errorf(0, "repetition of an empty match", "in %s, a repetition (*, + or ~) repeats something that "+
				"can match the empty string: make what is repeated match at least one character", in)
		}
		return checkRepeats(x.x, in, nullable)
	}
	return nil
}

// leftRefs are the rules x may begin with (appended to out).
func leftRefs(x expr, nullable map[string]bool, out []string) []string {
	switch x := x.(type) {
	case ref:
		return append(out, string(x))
	case seq:
		for _, y := range x {
			out = leftRefs(y, nullable, out)
			if !canBeEmpty(y, nullable) {
				break
			}
		}
	case alt:
		for _, y := range x {
			out = leftRefs(y, nullable, out)
		}
	case rep:
		return leftRefs(x.x, nullable, out)
	}
	return out
}

// leftCycle is a path of leftmost references from at back to target, or nil.
func leftCycle(target, at string, first map[string][]string, seen map[string]bool) []string {
	for _, next := range first[at] {
		if next == target {
			return []string{next}
		}
		if seen[next] {
			continue
		}
		seen[next] = true
		if path := leftCycle(target, next, first, seen); path != nil {
			return append([]string{next}, path...)
		}
	}
	return nil
}

package jinja

import (
	"fmt"
	"strings"
)

// The limits of one rendering. A chat template comes with the model (whoever
// published it) and renders what clients send, in the runner's process: steps alone
// do not bound it, since a few steps can double a string thirty times, repeat it a
// million times or recurse until the stack is exhausted (which kills the process,
// recover or not).
const (
	// maxOutput bounds the rendered text.
	maxOutput = 64 << 20
	// maxSteps bounds the statements and loop iterations.
	maxSteps = 1_000_000
	// MaxValueBytes bounds one string the template builds (by ~, +, *, a filter, a
	// method, a macro): a prompt is at most a few MiB.
	MaxValueBytes = 32 << 20
	// MaxListItems bounds one list the template builds.
	MaxListItems = 1 << 20
	// MaxProducedBytes bounds all the strings and lists (16 bytes an item) that one
	// rendering builds, so that many values each under MaxValueBytes cannot add up.
	MaxProducedBytes = 256 << 20
	// MaxCallDepth bounds nested macro and caller() calls.
	MaxCallDepth = 64
	// maxEvalDepth bounds the evaluator's recursion (nested expressions, blocks
	// and calls), far below what exhausts a goroutine's stack.
	maxEvalDepth = 4096
	// MaxNesting bounds the nesting of blocks and expressions a template may parse.
	MaxNesting = 256
)

// LimitError is a rendering that went beyond one of the limits above: the template
// (or what it was given) would have taken memory or stack without bound.
type LimitError struct {
	// Limit names it: "string size", "list size", "bytes built", "call depth",
	// "nesting depth", "output size", "steps" or "work".
	Limit string
	// Size is what the template asked for; Max the limit.
	Size, Max int64
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("the template exceeded its %s limit (%d, over %d)", e.Limit, e.Size, e.Max)
}

// budget is shared by a rendering and its sub-renderings (macros, set blocks,
// filter blocks, caller()).
type budget struct {
	maxSteps int
	steps    int
	maxWork  int64
	work     int64
	produced int64
	calls    int
	depth    int
	// strs are the rune indexes of the long strings the rendering indexed.
	strs map[strKey]*strIndex
}

// fitString refuses a string of n bytes before it is built.
func fitString(n int64) error {
	if n > MaxValueBytes || n < 0 {
		return &LimitError{Limit: "string size", Size: n, Max: MaxValueBytes}
	}
	return nil
}

// fitList refuses a list of n items before it is built.
func fitList(n int64) error {
	if n > MaxListItems || n < 0 {
		return &LimitError{Limit: "list size", Size: n, Max: MaxListItems}
	}
	return nil
}

// mustFitString panics with the *LimitError of fitString, for the value helpers
// (repr, tojson) that return no error; Render turns the panic back into the error.
func mustFitString(n int64) {
	if err := fitString(n); err != nil {
		panic(err)
	}
}

// produced counts a value the template built against MaxProducedBytes (and checks
// its own size, for the builders that could not check before).
func (r *renderer) produced(v any) error {
	var n int64
	switch v := v.(type) {
	case string:
		n = int64(len(v))
		if err := fitString(n); err != nil {
			return err
		}
	case *List:
		n = 16 * int64(len(v.Items))
		if err := fitList(int64(len(v.Items))); err != nil {
			return err
		}
	default:
		return nil
	}
	r.b.produced += n
	if r.b.produced > MaxProducedBytes {
		return &LimitError{Limit: "bytes built", Size: r.b.produced, Max: MaxProducedBytes}
	}
	return nil
}

// enter counts one level of the evaluator's recursion; leave undoes it.
func (r *renderer) enter() error {
	r.b.depth++
	if r.b.depth > maxEvalDepth {
		return &LimitError{Limit: "nesting depth", Size: int64(r.b.depth), Max: maxEvalDepth}
	}
	return nil
}

func (r *renderer) leave() { r.b.depth-- }

// call counts one macro or caller() call around f.
func (r *renderer) call(f func() (any, error)) (any, error) {
	r.b.calls++
	defer func() { r.b.calls-- }()
	if r.b.calls > MaxCallDepth {
		return nil, &LimitError{Limit: "call depth", Size: int64(r.b.calls), Max: MaxCallDepth}
	}
	return f() // the caller's evalCall counts what it returns
}

// joinStrings is strings.Join within MaxValueBytes.
func joinStrings(parts []string, sep string) (string, error) {
	n := int64(len(sep)) * int64(max(len(parts)-1, 0))
	for _, p := range parts {
		n += int64(len(p))
	}
	if err := fitString(n); err != nil {
		return "", err
	}
	return strings.Join(parts, sep), nil
}

// replaceString is strings.Replace within MaxValueBytes.
func replaceString(s, old, new string, n int) (string, error) {
	count := strings.Count(s, old)
	if n >= 0 {
		count = min(count, n)
	}
	if err := fitString(int64(len(s)) + int64(count)*(int64(len(new))-int64(len(old)))); err != nil {
		return "", err
	}
	return strings.Replace(s, old, new, n), nil
}

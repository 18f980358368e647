// Package wide is counted by widest-method-set (methods-under wide): Wide has 5
// methods over two files, Box 5 with its type parameters, Narrow 2; sub.Deep, a folder
// below, 5 too. Wide's method in wide_test.go and wideout's 7 are not counted.
package wide

// Wide has three value methods here and two pointer methods in more.go.
type Wide struct{ n int }

func (w Wide) a() int { return w.n }
func (w Wide) b() int { return w.n }
func (Wide) c()       {}

// Box is generic: its receivers carry type parameters.
type Box[K comparable, V any] struct{ m map[K]V }

func (b *Box[K, V]) get(k K) V    { return b.m[k] }
func (b *Box[K, V]) put(k K, v V) { b.m[k] = v }
func (b Box[K, V]) len() int      { return len(b.m) }
func (b Box[_, _]) empty() bool   { return len(b.m) == 0 }
func (b *Box[K, V]) clear()       { clear(b.m) }

// Narrow has two.
type Narrow struct{}

func (Narrow) x()  {}
func (*Narrow) y() {}

// free is a function, no method.
func free() {}

package pool

import (
	"bytes"
	"sync"
)

func (p *Pool) settleLocked() {}

func helperLocked() {}

// guarded embeds its mutex.
type guarded struct {
	sync.Mutex
	n int
}

func (g *guarded) inc() {
	g.Lock() // lock site 4
	g.n++
	g.Unlock()
	var l sync.Locker = g
	l.Lock() // through an interface: not counted
	l.Unlock()
}

// Not pointer-only: a pointer to an unnamed type, to itself, to a type outside the
// module, to a type parameter; two fields.
type counter struct{ n *int }

func (c counter) inc() { *c.n++ }

type self struct{ next *self }

func (s self) last() *self { return s.next }

type buffer struct{ b *bytes.Buffer }

func (b buffer) len() int { return b.b.Len() }

type wrap[T any] struct{ v *T }

func (w wrap[T]) get() *T { return w.v }

type two struct{ a, b *Pool }

func (t two) first() *Pool { return t.a }

func wakeUp() {}

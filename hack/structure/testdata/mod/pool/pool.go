// Package pool is the walked package. Acquire's tour, with its files:
// pool.go → load.go → pool.go → load.go → pool.go → settle.go → pool.go → load.go →
// pool.go → settle.go → pool.go (11 stays, 8 returns); without entering the functions
// stored in func-typed fields (walk-fields false), the last two stays go
// (9 stays, 6 returns).
package pool

import (
	"sync"

	"example.com/mod/internal/rules"
)

// Pool is the owner.
type Pool struct {
	mu    sync.Mutex
	st    *state
	load  loader
	wake  func()     // holds wakeUp: entered
	max   func() int // holds a function of another package: not entered
	trace func()     // holds a function literal: not entered
}

// New stores the functions its fields call.
func New() *Pool {
	p := &Pool{st: &state{}, wake: wakeUp}
	p.load = loader{p}
	p.max = rules.Max
	p.trace = func() { helperLocked() }
	return p
}

// state is the pool's state type: its …Locked methods are not counted.
type state struct {
	mu sync.RWMutex
	n  int
}

func (s *state) addLocked() { s.n++ }

func (s *state) read() int {
	s.mu.RLock() // lock site 1
	defer s.mu.RUnlock()
	return s.n
}

// Acquire is the walk's root.
func (p *Pool) Acquire() int {
	p.mu.Lock() // lock site 2
	p.st.addLocked()
	p.mu.Unlock()
	p.load.await(func() { p.settleLocked() })
	go p.load.start()
	p.trace()
	p.wake()
	return p.st.read() + p.max()
}

// Package pool is the walked package. Acquire's tour, with its files:
// pool.go → load.go → pool.go → load.go → pool.go → settle.go → pool.go → load.go → pool.go
// (9 stays, 6 returns).
package pool

import (
	"sync"

	"example.com/mod/internal/rules"
)

// Pool is the owner.
type Pool struct {
	mu   sync.Mutex
	st   *state
	load loader
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
	return p.st.read() + rules.Max()
}

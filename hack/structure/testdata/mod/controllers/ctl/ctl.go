// Package ctl holds a pointer to a type of another package of the module: its 1
// method is counted.
package ctl

import "example.com/mod/pool"

// Name is the controller's name.
const Name = "ctl"

type holder struct{ p *pool.Pool }

func (h holder) acquire() int { return h.p.Acquire() }

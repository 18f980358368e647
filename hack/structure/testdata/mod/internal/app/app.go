// Package app is a composition root in internal/: it imports a command and the pool
// (2 upward imports, both above the ceiling) and the rules (not upward).
package app

import (
	"example.com/mod/internal/rules"
	"example.com/mod/internal/tool"
	"example.com/mod/pool"
)

// Main wires them.
func Main() int { _ = tool.Run(); return new(pool.Pool).Acquire() + rules.Max() }

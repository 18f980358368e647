// Package tool is a command in internal/: its import of controllers is above the
// ceiling (1 upward import), its import of lib is not.
package tool

import (
	"example.com/mod/controllers/ctl"
	"example.com/mod/internal/lib"
)

// Run names the controller.
func Run() string { return ctl.Name + string(rune(lib.Limit())) }

// Package lib is a ground library that imports the domain above it: 1 upward import.
package lib

import "example.com/mod/internal/rules"

// Limit is the rules' largest count.
func Limit() int { return rules.Max() }

// Package rules is a domain package: internal/lib may not import it.
package rules

// Max is the largest count.
func Max() int { return 3 }
